"""The x86 platform: Linux on x86_64 with AVX-512 (recommended) or AVX2 (limited).

Detection is one whole-word look at the CPU flags: ``avx512f`` gives the AVX-512
path, ``avx2`` alone the slower AVX2 path (with a start-up warning saying so),
neither a miss naming both flags. The AMD Zen platform (``glowlm-zen``)
subclasses this class and ranks above it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from glowlm.plugin_api import (
    Capabilities,
    HostInfo,
    Match,
    Platform,
    core_env,
    live_host,
)

from glowlm_x86.settings import KERNEL_ISA

if TYPE_CHECKING:
    from glowlm.plugin_api import AttentionBackend, LinearMethod, OpsTable

    from glowlm_x86.kernels import KernelLibrary

X86_MACHINES = ("x86_64", "amd64")
#: Checkpoint quantization methods (``quant_method``) the x86 platform declares.
X86_QUANTIZATION = ("awq", "gptq", "compressed-tensors", "gguf")
AVX2_WARNING = ("AVX2-only CPU: the AVX-512 kernels are unavailable; attention and GEMM "
                "use the slower AVX2 path")
ZENTORCH_HINT = ("AMD Zen CPU with AVX-512 detected but zentorch is not installed: running "
                 "the x86 (oneDNN) path; `pip install glowlm-zen[zentorch]` enables AMD's "
                 "ZenDNN kernels")


#: The kernel modules each detected ISA family may load (the live CPU picks among them).
FAMILY_MODULES = {"avx2": ("avx2",), "avx512": ("avx512", "avx512-bf16", "avx2")}


def installed_kernels(isa: str) -> tuple[str, ...]:
    """The compiled ops, where ``pip install`` built a module this ISA family loads; else ``()``.

    What ``glowlm platforms`` prints before anything is loaded: listing the ops from
    the CPU alone would name kernels an install without a compiler (or with
    ``GLOWLM_BUILD_KERNELS=0``) does not have, and listing none would call a host
    whose modules are installed a reference host. A failed load empties the list again
    (:meth:`X86Platform.kernels`), so what is listed is what runs.
    """
    from glowlm_kernels import build

    from glowlm_x86.kernels.ops import OP_NAMES

    if core_env().disable_kernels:
        return ()
    package = Path(__file__).resolve().parent
    for variant in FAMILY_MODULES.get(isa, ()):
        if any(package.glob(f"{build.VARIANTS['x86'][variant].stem}.*so")):
            return OP_NAMES
    return ()


class X86Platform(Platform):
    """Linux x86_64 with AVX-512 or AVX2.

    dtypes, in preference order: bfloat16, float32, float16. bfloat16 comes first
    because it is what the docs recommend on CPU (half the memory traffic of
    float32, the float32 exponent range, and native on CPUs with ``avx512_bf16``
    or AMX); float16 comes last because torch's CPU float16 kernels are uneven.
    All three are supported, so the order only decides the fallback for a model
    whose dtype is none of them.

    Kernels: :meth:`attention_backend`, :meth:`ops` and
    :meth:`unquantized_linear_method` return the compiled parts of
    ``glowlm_x86.kernels`` when they load, core's reference parts otherwise
    (``GLOWLM_DISABLE_KERNELS=1``, no compiler, a failed build). Loading is lazy:
    the first of those calls (engine construction) builds or loads the module, so
    detection and ``glowlm platforms`` never compile. Before the load
    ``capabilities.kernels`` names the ops where the install built a module
    (:func:`installed_kernels`); afterwards, the ops that loaded.
    """

    name = "x86"
    rank = 100

    def __init__(self, host: HostInfo, match: Match) -> None:
        super().__init__(host, match)
        self._kernels_lock = threading.Lock()
        self._kernels_tried = False
        self._library: KernelLibrary | None = None

    @classmethod
    def detect(cls, host: HostInfo) -> Match:
        if host.system != "Linux":
            return Match(False, f"needs Linux; this host runs {host.system or 'an unknown OS'}")
        if host.machine.lower() not in X86_MACHINES:
            return Match(False, f"needs an x86_64 CPU; this host is {host.machine or 'unknown'}")
        if host.has_flag("avx512f"):
            return Match(True, "x86_64 CPU with avx512f: AVX-512 path (recommended)",
                         isa="avx512")
        if host.has_flag("avx2"):
            return Match(True, "x86_64 CPU with avx2 but no avx512f: limited AVX2 path",
                         isa="avx2")
        best = next((f for f in ("avx", "sse4_2", "sse4_1", "ssse3", "sse2")
                     if host.has_flag(f)), "none")
        return Match(False, f"x86_64 CPU lacks avx2 and avx512f (best SIMD flag: {best}); "
                            "the x86 kernels need at least AVX2")

    @classmethod
    def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
        isa = match.isa or "avx2"
        return Capabilities(
            isa=isa,
            dtypes=(torch.bfloat16, torch.float32, torch.float16),
            quantization=X86_QUANTIZATION,
            kernels=installed_kernels(isa),
        )

    def startup_notes(self) -> list[str]:
        notes = super().startup_notes()
        if self.capabilities.isa == "avx2":
            notes.append(AVX2_WARNING)
        elif not (self.host.has_flag("avx512_bf16") or self.host.has_flag("amx_bf16")):
            notes.append("no avx512_bf16/amx_bf16: bfloat16 matmuls are converted through "
                         "float32 (correct, slower than on CPUs with native bf16)")
        if not self._kernels_tried and not self.capabilities.kernels \
                and not core_env().disable_kernels:
            notes.append("glowlm-x86: kernels not built at install (no compiler then, or "
                         "GLOWLM_BUILD_KERNELS=0): compiled on first use where a C++ "
                         "compiler is present, core's reference kernels otherwise")
        if is_amd_avx512(self.host) and not self.host.has_module("zentorch"):
            notes.append(ZENTORCH_HINT)
        return notes

    # -- compiled kernels ----------------------------------------------------------

    def kernel_isa(self) -> str | None:
        """The kernel module this process may run: the platform's ISA, capped by the live CPU.

        Checked against the CPU this process runs on (not the host the platform
        was built for, which tests replay from recordings), so AVX-512 code is
        never loaded on an AVX2-only CPU. ``GLOWLM_KERNEL_ISA`` pins one (an error
        if this CPU cannot run it).
        """
        from glowlm_x86.kernels import cpu_isa

        return cpu_isa(live_host(), allow_avx512=self.capabilities.isa == "avx512",
                       requested=KERNEL_ISA.get())

    def kernels(self) -> KernelLibrary | None:
        """The loaded kernel module, built on first use; ``None`` means reference kernels."""
        with self._kernels_lock:
            if not self._kernels_tried:
                self._kernels_tried = True
                self._library = self._load_kernels()
                if self._library is None:
                    # What is listed is what runs: a failed load or a disabled build
                    # leaves the reference parts (and Zen's own zentorch linear).
                    from glowlm_x86.kernels.ops import OP_NAMES

                    names = tuple(n for n in self.capabilities.kernels if n not in OP_NAMES)
                    self.capabilities = dataclasses.replace(self.capabilities, kernels=names)
                else:
                    from glowlm_x86.kernels.ops import OP_NAMES

                    # Keep what a subclass already declared (Zen: its zentorch linear).
                    names = self.capabilities.kernels + tuple(
                        n for n in OP_NAMES if n not in self.capabilities.kernels)
                    self.capabilities = dataclasses.replace(self.capabilities, kernels=names)
            return self._library

    def _load_kernels(self) -> KernelLibrary | None:
        env = core_env()
        if env.disable_kernels:
            return None
        isa = self.kernel_isa()
        if isa is None:
            return None
        from glowlm_x86.kernels import load

        return load(isa, env.kernel_cache)

    def attention_backend(self) -> AttentionBackend:
        library = self.kernels()
        if library is None:
            return super().attention_backend()
        from glowlm_x86.kernels import VECTOR_WIDTH
        from glowlm_x86.kernels.attention import X86AttentionBackend

        return X86AttentionBackend(VECTOR_WIDTH[library.isa])

    def ops(self) -> OpsTable:
        if self.kernels() is None:
            return super().ops()
        from glowlm.plugin_api import OpsTable

        from glowlm_x86.kernels import ops
        from glowlm_x86.kernels.attention import X86AttentionBackend
        from glowlm_x86.kernels.fused import (
            make_ln_decoder_layer,
            make_ln_decoder_stack,
            make_rms_decoder_layer,
            make_rms_decoder_stack,
        )
        from glowlm_x86.kernels.linear import dense_linear

        # The fused layer runs the x86 GEMV/GEMM itself, so only a platform whose dense
        # linear method runs those kernels offers it (Zen's only with the measured
        # choice, which keeps the fused ops for the token classes where they win:
        # glowlm.layers.linear_choice).
        linear = self.unquantized_linear_method()
        attention = self.attention_backend()
        fuse = (getattr(linear, "runs_fused_kernels", False)
                and isinstance(attention, X86AttentionBackend))
        table = OpsTable(rms_norm=ops.rms_norm, fused_add_rms_norm=ops.fused_add_rms_norm,
                         layer_norm=ops.layer_norm, rotary_embedding=ops.rotary_embedding,
                         silu_and_mul=ops.silu_and_mul, gelu=ops.gelu, gelu_tanh=ops.gelu_tanh,
                         relu=ops.relu, dense_linear=dense_linear,
                         fused_moe=_moe_op(linear),
                         lora_shrink_expand=_lora_op(linear),
                         ln_decoder_layer=make_ln_decoder_layer(linear.policy, attention)
                         if fuse else None,
                         rms_decoder_layer=make_rms_decoder_layer(linear.policy, attention)
                         if fuse else None,
                         ln_decoder_stack=make_ln_decoder_stack(linear.policy, attention)
                         if fuse else None,
                         rms_decoder_stack=make_rms_decoder_stack(linear.policy, attention)
                         if fuse else None,
                         shm_all_reduce=ops.shm_all_reduce)
        if not fuse:
            return table
        # Gemma 3's layers (described as DecoderLayerWeights; the others go through the
        # LayerNorm/RMSNorm ops above).
        from glowlm_x86.kernels.fused_gemma import gemma_ops

        return dataclasses.replace(table, **gemma_ops(linear.policy, attention))

    def unquantized_linear_method(self) -> LinearMethod:
        library = self.kernels()
        if library is None:
            return super().unquantized_linear_method()
        from glowlm_x86.kernels.linear import X86LinearMethod

        return X86LinearMethod(kernel_version=library.name)


def _moe_op(linear: object) -> Callable[..., torch.Tensor]:
    """The compiled ``fused_moe`` with the dense method's GEMV/GEMM switch (the rows up
    to which an expert's tokens stream its weights; 8 where the method has no policy)."""
    from glowlm_x86.kernels import ops

    policy = getattr(linear, "policy", None)
    return functools.partial(ops.fused_moe,
                             gemv_max_m=policy.gemv_max_m if policy is not None else 8)


def _lora_op(linear: object) -> Callable[..., torch.Tensor]:
    """The compiled ``lora_shrink_expand`` with the dense method's GEMV/GEMM switch."""
    from glowlm_x86.kernels import ops

    policy = getattr(linear, "policy", None)
    return functools.partial(ops.lora_shrink_expand,
                             gemv_max_m=policy.gemv_max_m if policy is not None else 8)


def is_amd_avx512(host: HostInfo) -> bool:
    """An AMD CPU with AVX-512 (Zen 4 or newer): where the Zen platform can apply."""
    return host.vendor == "AuthenticAMD" and host.has_flag("avx512f")
