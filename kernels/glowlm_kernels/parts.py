"""A plugin's compiled kernels as glowlm parts: ops table, attention backend, linear method.

Used by glowlm-arm and glowlm-s390x, whose modules register the same operators as
glowlm-x86's under their own namespace (``torch.ops.glowlm_arm``, ``glowlm_s390x``).
:class:`PluginKernels` picks the variant for the CPU this process runs on (never the
recorded host a test replays), loads it once (prebuilt at install, else the
developer fallback of :mod:`.build`), and hands out the parts.

glowlm-x86 keeps its own Python layer (``glowlm_x86.kernels``: the fused-layer ops,
fake registrations, its per-shape GEMM policy); the operators underneath are the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from glowlm.plugin_api import (
    TORCH_LINEAR,
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    LinearCandidate,
    OpsTable,
    ReferenceAttentionBackend,
    UnquantizedLinearMethod,
    onednn_candidates,
    reference_ops,
)
from torch import nn

from glowlm_kernels import build

#: The ops these parts use (``Capabilities.kernels`` of a platform running them).
OP_NAMES = ("rms_norm", "fused_add_rms_norm", "layer_norm", "rotary_embedding",
            "silu_and_mul", "gelu", "gelu_tanh", "relu", "gemv", "gemm", "fused_moe",
            "lora_shrink_expand", "write_kv", "paged_attention", "paged_attention_window")
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: KV cache dtypes the compiled attention reads: also the 8-bit floats of
#: ``--kv-cache-dtype fp8`` / ``fp8_e5m2`` (widened in registers, arch/vec_*.h).
KV_DTYPES = (*KERNEL_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2)
#: fp32 lanes per vector of every non-x86 variant (head and block sizes must be multiples).
VECTOR_WIDTH = 8
#: Token rows up to which the weight-streaming GEMV runs (x86's measured threshold).
GEMV_MAX_M = 8


class PluginKernels:
    """One plugin's kernel module in this process: chosen from the live CPU, loaded once."""

    def __init__(self, plugin: str, package_dir: Path, choose: Callable[[Any], str | None],
                 logger: Any) -> None:
        self.plugin = plugin
        self.package_dir = package_dir
        self.choose = choose  # HostInfo of the live CPU -> ISA variant name, or None
        self.logger = logger
        self._lock = threading.Lock()
        self._tried = False
        self._library: build.KernelLibrary | None = None
        self._version = ""
        self.why_not = ""

    @property
    def namespace(self) -> str:
        return f"glowlm_{self.plugin}"

    def library(self) -> build.KernelLibrary | None:
        """The loaded module, or None (``why_not`` says why; the platform runs reference)."""
        from glowlm.plugin_api import core_env, live_host

        with self._lock:
            if self._tried:
                return self._library
            self._tried = True
            env = core_env()
            isa = None if env.disable_kernels else self.choose(live_host())
            if env.disable_kernels:
                self.why_not = "GLOWLM_DISABLE_KERNELS=1"
            elif isa is None:
                self.why_not = "this process's CPU runs none of the plugin's kernel variants"
            else:
                variant = build.VARIANTS[self.plugin][isa]
                self._library = build.load(variant, self.package_dir, env.kernel_cache,
                                           self.logger)
                if self._library is None:
                    self.why_not = "the kernel module did not load (see the warning)"
            return self._library

    def version(self) -> str:
        """The loaded module's ISA and source hash (the linear choice's cache key part:
        a kernel change measures again); ``""`` before a module loaded."""
        lib = self._library
        if lib is None:
            return ""
        if not self._version:
            variant = build.VARIANTS[self.plugin][lib.isa]
            self._version = f"{lib.isa}-{build.source_hash(variant)}"
        return self._version

    def ops_table(self) -> OpsTable:
        """The compiled ops, the shared-memory all-reduce included: its release / acquire
        atomics (``cpu/shm_reduce.h``) are the fences a weakly ordered CPU needs, which
        the Python path gets only from a system call per publish and wait
        (:mod:`glowlm.distributed.fence`)."""
        ns = getattr(torch.ops, self.namespace)
        return OpsTable(rms_norm=ns.rms_norm, fused_add_rms_norm=ns.fused_add_rms_norm,
                        layer_norm=ns.layer_norm, rotary_embedding=ns.rotary_embedding,
                        silu_and_mul=ns.silu_and_mul, gelu=ns.gelu, gelu_tanh=ns.gelu_tanh,
                        relu=ns.relu, dense_linear=self.dense_linear,
                        fused_moe=self.fused_moe, lora_shrink_expand=self.lora_shrink_expand,
                        shm_all_reduce=ns.shm_all_reduce)

    def lora_shrink_expand(self, y: torch.Tensor, x: torch.Tensor, a: torch.Tensor,
                           b: torch.Tensor, groups: list[tuple[int, torch.Tensor | None]],
                           slots: torch.Tensor | None = None) -> torch.Tensor:
        """LoRA updates on their rows (``reference.lora_shrink_expand``'s contract): each
        used slot's rows gathered once, shrink and expand on the GEMV (the GEMM above
        :data:`GEMV_MAX_M` rows), the intermediate in fp32."""
        if a.dtype not in KERNEL_DTYPES or x.dtype not in KERNEL_DTYPES:
            return reference_ops.lora_shrink_expand(y, x, a, b, groups)
        if slots is None:
            slots = reference_ops.lora_row_slots(groups, x.shape[0])
        ops = getattr(torch.ops, self.namespace)
        return ops.lora_shrink_expand(y, x, a, b, slots, GEMV_MAX_M)

    def fused_moe(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  activation: str = "silu") -> torch.Tensor:
        """The routed experts grouped by expert (``reference.fused_moe``'s contract): the
        GEMV over an expert's tokens up to :data:`GEMV_MAX_M` of them, the GEMM above."""
        if w13.dtype not in KERNEL_DTYPES or x.dtype not in KERNEL_DTYPES:
            return reference_ops.fused_moe(x, w13, w2, topk_weights, topk_ids, activation)
        ops = getattr(torch.ops, self.namespace)
        return ops.fused_moe(x, w13, w2, topk_weights, topk_ids, activation, GEMV_MAX_M)

    def dense_linear(self, x: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear``: the GEMV for a few token rows, the blocked GEMM above."""
        if weight.dtype not in KERNEL_DTYPES:
            return F.linear(x, weight, bias)
        ns = getattr(torch.ops, self.namespace)
        x2 = x.reshape(-1, x.shape[-1])
        y = (ns.gemv if x2.shape[0] <= GEMV_MAX_M else ns.gemm)(x2, weight, bias)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    def linear_method(self) -> UnquantizedLinearMethod:
        return CompiledLinearMethod(self.dense_linear, self.version() or "unknown")

    def attention_backend(self) -> AttentionBackend:
        return CompiledAttentionBackend(self.namespace)


def _kernel_weight(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 2 and w.layout == torch.strided
            and w.dtype in KERNEL_DTYPES)


def compiled_candidate(linear: Callable[..., torch.Tensor], version: str) -> LinearCandidate:
    """The plugin's GEMV / GEMM as a measured-choice candidate, named ``glowlm`` as on x86
    (so ``GLOWLM_LINEAR_IMPL=glowlm`` pins it on every platform).

    Not ``fused``: these platforms have no fused decoder ops whose kernels it would be.
    The version holds the module's ISA and source hash and the GEMV/GEMM switch.
    """
    return LinearCandidate("glowlm", f"{version}-m{GEMV_MAX_M}",
                           lambda layer, x, bias: linear(x, layer.weight, bias),
                           _kernel_weight)


class CompiledLinearMethod(UnquantizedLinearMethod):
    """Dense weights through the plugin's GEMV / GEMM.

    Offers the measured choice its compiled GEMV/GEMM first (the incumbent, what
    ``apply`` runs), then oneDNN on a packed weight where this torch has it, then
    torch's ``F.linear``: every kernel the platform lists is a candidate, and each
    shape keeps whichever is fastest on this CPU (:mod:`glowlm.layers.linear_choice`).
    """

    def __init__(self, linear: Callable[..., torch.Tensor], version: str = "unknown") -> None:
        self.linear = linear
        self.version = version

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return self.linear(x, layer.weight, bias)

    def linear_candidates(self, layer: nn.Module) -> list[LinearCandidate]:
        return [compiled_candidate(self.linear, self.version), *onednn_candidates(),
                TORCH_LINEAR]


class CompiledAttentionBackend(AttentionBackend):
    """Compiled decode + chunked-prefill paged attention on core's cache layout.

    Shapes the kernel does not cover (head or block size not a multiple of 8, other
    cache dtypes) run core's reference backend. A layer with a sliding window (Gemma 3's
    local layers) runs ``paged_attention_window``, which attends the keys ``p`` with
    ``q - window < p <= q`` only.
    """

    def __init__(self, namespace: str) -> None:
        self.name = namespace.removeprefix("glowlm_")
        self._ops = getattr(torch.ops, namespace)
        self._reference = ReferenceAttentionBackend()

    def supports(self, head_size: int, block_size: int, kv_dtype: torch.dtype) -> bool:
        return (head_size % VECTOR_WIDTH == 0 and block_size % VECTOR_WIDTH == 0
                and kv_dtype in KV_DTYPES)

    def forward(self, layer: AttentionLayerSpec, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
                ) -> torch.Tensor:
        if not self.supports(layer.head_size, metadata.block_size, kv_cache.dtype):
            if metadata.num_decodes and "decode_mask" not in metadata.extras:
                self._reference.build_metadata(metadata)
            return self._reference.forward(layer, query, key, value, kv_cache, metadata)
        self._ops.write_kv(kv_cache, key, value, metadata.slot_mapping)
        window = getattr(layer, "sliding_window", None)
        if window and metadata.max_seq_len > window:  # the window hides some keys
            out = self._ops.paged_attention_window(query, kv_cache, metadata.block_tables,
                                                   metadata.query_start_loc,
                                                   metadata.seq_lens, layer.scale, window)
        else:
            out = self._ops.paged_attention(query, kv_cache, metadata.block_tables,
                                            metadata.query_start_loc, metadata.seq_lens,
                                            layer.scale)
        return out.flatten(1)


class CompiledKernelsPlatform:
    """Mixin for a :class:`~glowlm.platforms.interface.Platform` running a plugin's kernels.

    The subclass sets ``kernel_plugin`` and ``kernel_package_dir`` and implements
    :meth:`kernel_variant`; its ``capabilities_for`` lists :meth:`installed_kernels`
    (:data:`OP_NAMES` and the quantized ops where the install built the modules, none
    where it built none: ``GLOWLM_BUILD_KERNELS=0``, or a wheel made on another
    machine). The first call for a part loads the module for the live CPU (a run-time
    build where none was installed and a compiler is present); if that fails the
    platform returns core's reference parts and its ``capabilities.kernels`` becomes
    empty, so what is listed is what runs.
    """

    kernel_plugin: str = ""
    kernel_package_dir: Path = Path()
    #: What ``capabilities.kernels`` lists when a module runs (the subclass's own list).
    kernel_names: tuple[str, ...] = OP_NAMES

    @classmethod
    def kernel_variant(cls, cpu: Any) -> str | None:
        raise NotImplementedError

    @classmethod
    def built_variants(cls) -> tuple[str, ...]:
        """The ISA variants ``pip install`` compiled into the package (their modules exist;
        whether each still matches the sources is :func:`glowlm_kernels.build.prebuilt`'s
        question, asked when one loads)."""
        out = []
        for isa in build.INSTALL_ISAS.get(cls.kernel_plugin, ()):
            stem = build.VARIANTS[cls.kernel_plugin][isa].stem
            if any(cls.kernel_package_dir.glob(f"{stem}.*so")) or \
                    (cls.kernel_package_dir / f"{stem}.so").exists():
                out.append(isa)
        return tuple(out)

    @classmethod
    def installed_kernels(cls) -> tuple[str, ...]:
        """``kernel_names`` where the install built modules, else ``()`` (``glowlm
        platforms`` then says "kernels not built" instead of naming kernels that are not
        there)."""
        return cls.kernel_names if cls.built_variants() else ()

    def compiled(self) -> PluginKernels | None:
        import dataclasses

        from glowlm.plugin_api import init_logger

        if not hasattr(self, "_plugin_kernels"):
            self._plugin_kernels = PluginKernels(
                self.kernel_plugin, self.kernel_package_dir, self.kernel_variant,
                init_logger(f"glowlm.{self.kernel_plugin}.kernels"))
        kernels = self._plugin_kernels
        caps = self.capabilities  # type: ignore[attr-defined]
        if kernels.library() is None:
            if caps.kernels:
                self.capabilities = dataclasses.replace(caps, kernels=())
            return None
        if not caps.kernels:  # none installed, built at run time: they run now
            self.capabilities = dataclasses.replace(caps, kernels=self.kernel_names)
        return kernels

    def kernel_note(self) -> str:
        """One start-up line: which kernels run, or why the reference ops do.

        Never loads the module itself (``glowlm platforms`` shows notes and must not
        compile): before an engine asked for parts it names the variant the live CPU
        would load, or says the install built none.
        """
        pk = getattr(self, "_plugin_kernels", None)
        if pk is None or not pk._tried:
            from glowlm.plugin_api import live_host

            isa = self.kernel_variant(live_host())
            if isa is None:
                return (f"glowlm-{self.kernel_plugin}: compiled kernels for this CPU family; "
                        "this process's CPU is not one, so an engine here runs core's "
                        "reference ops")
            if isa not in self.built_variants():
                return (f"glowlm-{self.kernel_plugin}: kernels not built (the install "
                        f"compiled no {isa} module: GLOWLM_BUILD_KERNELS=0, or no torch or "
                        "compiler at install); an engine compiles them at run time where "
                        "a C++ compiler and ninja are present, else runs core's reference "
                        f"ops (reinstall: pip install --no-build-isolation "
                        f"glowlm-{self.kernel_plugin})")
            return f"glowlm-{self.kernel_plugin}: compiled kernels {isa}"
        kernels = self.compiled()
        if kernels is None:
            return (f"glowlm-{self.kernel_plugin}: core's reference ops "
                    f"({self._plugin_kernels.why_not})")
        lib = kernels.library()
        assert lib is not None
        how = "built at install" if lib.prebuilt else "built at run time"
        return f"glowlm-{self.kernel_plugin}: compiled kernels {lib.isa} ({how})"

    def attention_backend(self) -> AttentionBackend:
        kernels = self.compiled()
        if kernels is None:
            return super().attention_backend()  # type: ignore[misc]
        return kernels.attention_backend()

    def ops(self) -> OpsTable:
        kernels = self.compiled()
        if kernels is None:
            return super().ops()  # type: ignore[misc]
        return kernels.ops_table()

    def unquantized_linear_method(self) -> UnquantizedLinearMethod:
        kernels = self.compiled()
        if kernels is None:
            return super().unquantized_linear_method()  # type: ignore[misc]
        return kernels.linear_method()
