"""The x86 quantized linear methods: core's formats, compiled matmuls (``quant_*.cpp``).

:func:`quantization_configs` is what the plugin's ``glowlm_quantization_configs`` hook
returns: AWQ, GPTQ, compressed-tensors and GGUF configs serving the x86 platform (and
Zen, which extends it). Their kernels are :class:`X86QuantKernels` when the compiled
module loaded, core's pure-PyTorch reference otherwise (``GLOWLM_DISABLE_KERNELS=1``, no
compiler), so a quantized checkpoint always runs.

The layouts and their repacking are the shared kernel tree's
(:mod:`glowlm_kernels.quant`, also used by the Arm and s390x plugins); this module binds
them to ``torch.ops.glowlm_x86`` and keeps x86's fallback for a kernel module built
before the quantized sources joined it (:func:`load_quant_ops`).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from glowlm.plugin_api import REFERENCE_QUANT_KERNELS as REFERENCE_KERNELS
from glowlm.plugin_api import QuantizationConfig, QuantKernels, core_env, init_logger
from glowlm.plugin_api import quantization_for_platform as for_platform
from glowlm_kernels.build import QUANT_SOURCES
from glowlm_kernels.quant import (  # noqa: F401 - re-exported: the layouts' home was here
    QUANT_OP_NAMES,
    ROWS,
    CompiledQuantKernels,
    PackedW8A8,
    PackedWeightOnly,
    pack_w8a8,
    pack_weight_only,
    packed_rows,
    quant_ops_registered,
)
from glowlm_kernels.quant import register_fakes as _register_fakes

from glowlm_x86.platform import X86Platform

logger = init_logger("glowlm.x86.quant")

if TYPE_CHECKING:
    from glowlm.plugin_api import HostInfo, Platform

class X86QuantKernels(CompiledQuantKernels):
    """The compiled kernels (``torch.ops.glowlm_x86.wna16_linear`` / ``w8a8_linear`` /
    ``wna8_linear``). ``int8_activations``: the module has no bf16 dot product (avx2,
    avx512), or has one too slow to keep up with the memory read (avx512-bf16 on Zen 4,
    :func:`half_rate_avx512`), so weight-only and GGUF layers multiply int8 activations
    by default (4-bit decode: half the dot-product instructions per weight byte of the
    bf16-dot tile, ~2-3x fewer than the fp32 path)."""

    def __init__(self, int8_activations: bool = False, w8a8_as_blocks: bool = False,
                 isa: str = "") -> None:
        super().__init__("glowlm_x86", "x86", int8_activations, w8a8_as_blocks, isa)


#: ISAs whose weight-only fast path is int8 activations: vpmaddubsw, and no vdpbf16ps
#: (the portable module runs wna8_linear's plain loops: correct, not faster).
INT8_ACTIVATION_ISAS = frozenset({"avx2", "avx512"})
#: ISAs whose w8a8_linear is plain loops (no vpdpbusd) while wna8_linear has its
#: vpmaddubsw tile: dynamic W8A8 runs there as 8-bit blocks (94-97 % of the read at
#: M = 1 against 80-86 %, M = 4 60-64 % against 45 %; docs/quantization.md).
W8A8_AS_BLOCKS_ISAS = frozenset({"avx2"})
X86_QUANT_KERNELS = X86QuantKernels()
_BY_ISA: dict[tuple[str, bool], X86QuantKernels] = {}


def half_rate_avx512(host: HostInfo) -> bool:
    """Whether ``host`` runs 512-bit dot products at half the 256-bit rate: AMD Zen 4
    (CPUID family 25 with AVX-512), whose 512-bit instructions take two passes through
    256-bit units.

    Why it matters: the bf16-dot A16 tile does two multiply-adds per 32-bit lane
    (``vdpbf16ps``), the int8 tile four (``vpdpbusd`` / ``vpmaddubsw``). Measured on a
    Zen 4 guest (2026-12-06): one ``vdpbf16ps zmm`` every 2 cycles, so a core's 4-bit
    A16 decode tops out at ~30 GB/s of packed weights in cache and reaches 75-80 % of a
    two-thread read, while the int8 tile reaches the read (engine W4A16 decode 43-44 ->
    50-63 tok/s, TTFT 616 -> 404-455 ms). Zen 5 (family 26) runs full-width 512-bit units
    and its A16 tile reached 87-103 % of the read (docs/quantization.md), so it keeps
    the checkpoint's arithmetic."""
    return (host.vendor == "AuthenticAMD" and host.cpu_family == 25
            and host.has_flag("avx512f"))


def int8_activations_auto(isa: str, host: HostInfo) -> bool:
    """What ``auto`` means for weight-only layers' activations with the ``isa`` module on
    ``host``: int8 where it is the fast path (no bf16 dot product: avx2, avx512; or one
    too slow to keep up with the read: avx512-bf16 on Zen 4)."""
    return isa in INT8_ACTIVATION_ISAS or (isa == "avx512-bf16" and half_rate_avx512(host))


def kernels_for_isa(isa: str, int8_activations: bool | None = None) -> X86QuantKernels:
    """The kernel set of the module built for ``isa`` (one object per ISA and
    activation rule). ``int8_activations`` (default: the ISA's rule,
    ``INT8_ACTIVATION_ISAS``) is what ``auto`` means for weight-only layers there."""
    int8 = isa in INT8_ACTIVATION_ISAS if int8_activations is None else int8_activations
    if (isa, int8) not in _BY_ISA:
        _BY_ISA[isa, int8] = X86QuantKernels(int8, isa in W8A8_AS_BLOCKS_ISAS, isa)
    return _BY_ISA[isa, int8]


#: The quantized ops' translation units in the shared tree (one per tile family, and
#: their registration).
SOURCES = QUANT_SOURCES
_lock = threading.Lock()
_state: dict[str, bool] = {}


def _sources(csrc: Path) -> list[Path] | None:
    """The quantized sources in ``csrc`` or, failing that, this checkout's shared tree."""
    repo = Path(__file__).resolve().parents[3]
    for tree in (csrc, repo / "kernels" / "glowlm_kernels" / "csrc"):
        paths = [tree / name for name in SOURCES]
        if all(p.exists() for p in paths):
            return paths
    return None


def _registered() -> bool:
    return quant_ops_registered("glowlm_x86")


def load_quant_ops(isa: str) -> bool:
    """Make ``torch.ops.glowlm_x86.{wna16,w8a8}_linear`` available for ``isa``.

    When the kernel module itself lists the quantized sources the ops are already there.
    Otherwise they are compiled once on their own (same flags and include path as the
    kernel module, cached under ``GLOWLM_KERNEL_CACHE`` by a hash of the sources and
    flags) and loaded beside it. False, with one warning line, if that fails: the
    quantized layers then run core's reference.
    """
    with _lock:
        if isa in _state:
            return _state[isa]
        ok = _registered()
        if not ok:
            try:
                _build_and_load(isa)
                ok = _registered()
            except Exception as exc:  # a broken toolchain must not stop the engine
                logger.warning("glowlm-x86 quantized kernels unavailable (%s: %s); quantized "
                               "layers use core's reference", type(exc).__name__,
                               " ".join(str(exc).split())[:300])
        if ok:
            register_fakes()
        _state[isa] = ok
        return ok


def _build_and_load(isa: str) -> None:
    from torch.utils import cpp_extension

    from glowlm_x86.kernels import build as kb

    variants = getattr(kb, "VARIANTS", None)
    if variants is not None:
        flags = list(variants[isa].cflags)
    else:
        flags = list(kb.COMMON_FLAGS + kb.ISA_FLAGS[isa])
    srcs = _sources(Path(kb.CSRC))
    if srcs is None:
        raise FileNotFoundError(f"{', '.join(SOURCES)} are not in {kb.CSRC}")
    h = hashlib.sha256()
    for src in srcs:
        h.update(src.read_bytes())
    for header in sorted(Path(kb.CSRC).rglob("*.h")):
        h.update(header.read_bytes())
    h.update(" ".join(flags).encode() + torch.__version__.encode())
    h.update(f"py{sys.version_info.major}{sys.version_info.minor}".encode())
    name = f"glowlm_x86_quant_{isa}_{h.hexdigest()[:16]}"
    build_dir = Path(core_env().kernel_cache) / name
    so = build_dir / f"{name}.so"
    if not so.exists():
        build_dir.mkdir(parents=True, exist_ok=True)
        logger.info("compiling glowlm-x86 quantized kernels (%s), once...", isa)
        cpp_extension.load(name=name, sources=[str(s) for s in srcs], extra_cflags=flags,
                           extra_ldflags=["-fopenmp"], extra_include_paths=[str(kb.CSRC)],
                           build_directory=str(build_dir), is_python_module=False,
                           verbose=False)
    if not _registered():
        torch.ops.load_library(str(so))


def _kernels_for(platform: Platform) -> QuantKernels:
    if isinstance(platform, X86Platform):
        library = platform.kernels()
        if library is not None and load_quant_ops(library.isa):
            return kernels_for_isa(library.isa, int8_activations_auto(library.isa,
                                                                      platform.host))
    return REFERENCE_KERNELS


def quantization_configs() -> list[type[QuantizationConfig]]:
    return for_platform(X86Platform, _kernels_for)


def register_fakes() -> None:
    """Shape-only implementations so ``torch.compile`` can trace the quantized ops."""
    _register_fakes("glowlm_x86")
