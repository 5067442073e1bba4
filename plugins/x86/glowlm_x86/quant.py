"""The x86 quantized linear methods: core's formats, compiled matmuls (``quant_linear.cpp``).

:func:`quantization_configs` is what the plugin's ``glowlm_quantization_configs`` hook
returns: AWQ, GPTQ and compressed-tensors configs serving the x86 platform (and Zen,
which extends it). Their kernels are :class:`X86QuantKernels` when the compiled module
loaded, core's pure-PyTorch reference otherwise (``GLOWLM_DISABLE_KERNELS=1``, no
compiler), so a quantized checkpoint always runs.

Repacking happens once per layer after loading (``prepare_*``): the canonical
unsigned values become the blocked layouts the kernels stream (see the C++ file's
header), scales and ``zero * scale`` become ``[N/16, groups, 16]``, so the kernel reads
16 consecutive output rows per load and each block's in one stream — float16 where that
holds them exactly, and with no ``zero * scale`` at all for symmetric weights, since
decode streams these bytes once per token too.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from glowlm.plugin_api import REFERENCE_QUANT_KERNELS as REFERENCE_KERNELS
from glowlm.plugin_api import (
    Int8Weights,
    QuantizationConfig,
    QuantKernels,
    WeightOnlyInt,
    core_env,
    init_logger,
)
from glowlm.plugin_api import quantization_for_platform as for_platform

from glowlm_x86.platform import X86Platform

logger = init_logger("glowlm.x86.quant")

if TYPE_CHECKING:
    from glowlm.plugin_api import Platform

ROWS = 16  #: output rows per weight block (one AVX-512 register of fp32 / int32 sums)
#: The compiled quantized ops (added to ``Capabilities.kernels`` when they load).
QUANT_OP_NAMES = ("wna16_linear", "w8a8_linear")


def _pad_rows(t: torch.Tensor, rows: int, value: float = 0) -> torch.Tensor:
    extra = (-t.shape[0]) % rows
    return F.pad(t, (0, 0, 0, extra), value=value) if extra else t


@dataclass
class PackedWeightOnly:
    weight: torch.Tensor         #: uint8, blocked (quant_linear.cpp)
    scales: torch.Tensor         #: float32 or float16 [Npad/16, G, 16]
    #: zero * scale, scales' dtype and shape; empty when symmetric (zero 2**(bits-1))
    zs: torch.Tensor
    bits: int
    group_size: int
    n: int
    perm: torch.Tensor | None


@dataclass
class PackedW8A8:
    weight: torch.Tensor         #: int8 [Npad/16, Kpad/4, 16, 4]
    scale: torch.Tensor          #: float32 [Npad]
    wsum: torch.Tensor           #: int32 [Npad]: row sums, undo the +128 of the u8 activations
    input_scale: float           #: <= 0: dynamic per token
    input_zero_point: int
    n: int


def pack_weight_only(w: WeightOnlyInt) -> PackedWeightOnly:
    """Canonical [N, K] values -> ``[N/16][K/4][16][2]`` nibble bytes or ``[N/16][K/2][2][16]``.

    4 bits: each 32-byte unit holds 16 rows x 4 columns, byte ``2r + j`` column ``j`` in
    its low nibble and column ``2 + j`` in its high one, the operand order of a pairwise
    bf16 dot product (quant_linear.cpp).
    """
    n, k = w.q.shape
    q = _pad_rows(w.q, ROWS)
    npad = q.shape[0]
    if w.bits == 4:  # unit c of 16 rows: byte 2r + j = q[r, 4c + j] | q[r, 4c + 2 + j] << 4
        units = q.view(npad // ROWS, ROWS, k // 4, 2, 2)
        packed = (units[..., 0, :] | (units[..., 1, :] << 4)).permute(0, 2, 1, 3)
    else:
        packed = q.view(npad // ROWS, ROWS, k // 2, 2).permute(0, 2, 3, 1)
    scales = _pad_rows(w.scales.float(), ROWS)
    mid = float(1 << (w.bits - 1))
    # Symmetric (every zero point the midpoint): no zero * scale tensor; the kernel
    # derives it. Padded rows have scale 0, so their zero never matters.
    zeros = _pad_rows(w.zeros.float(), ROWS, value=mid)
    zs = None if bool((zeros == mid).all()) else zeros * scales
    # float16 where it holds every value exactly (GGUF's fp16 scales, bf16 scales within
    # fp16's normal range): half the bytes per group that decode streams.
    dtype = torch.float16 if all(_exact_half(t) for t in (scales, zs) if t is not None) \
        else torch.float32

    def blocked(t: torch.Tensor) -> torch.Tensor:  # [Npad, G] -> [Npad/16, G, 16]
        return t.view(npad // ROWS, ROWS, -1).permute(0, 2, 1).to(dtype).contiguous()

    return PackedWeightOnly(packed.contiguous(), blocked(scales),
                            torch.empty(0, dtype=dtype) if zs is None else blocked(zs),
                            w.bits, w.group_size, n, w.perm)


def _exact_half(t: torch.Tensor) -> bool:
    """Whether float32 ``t`` survives float16 bit for bit (subnormals excluded)."""
    h = t.to(torch.float16)
    tiny = (t != 0) & (t.abs() < torch.finfo(torch.float16).tiny)
    return bool(torch.equal(h.float(), t)) and not bool(tiny.any())


def packed_rows(p: PackedWeightOnly, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` of a packed weight as float32 ``[M, K]``, ``q·scale − zs`` as the
    kernels evaluate it: a tied embedding's lookup in a quantized LM head (GGUF), read
    from the blocked layout :func:`pack_weight_only` wrote, so no other copy is kept."""
    block, r = rows // ROWS, rows % ROWS
    if p.bits == 4:  # weight [Npad/16, K/4, 16, 2]: byte j of unit c holds 4c+j | 4c+2+j
        units = p.weight[block, :, r, :]                      # [M, K/4, 2]
        q = torch.stack([units & 0x0F, units >> 4], dim=2)    # [M, K/4, lo/hi, j]
    else:  # weight [Npad/16, K/2, 2, 16]
        q = p.weight[block, :, :, r]                          # [M, K/2, 2]
    q = q.reshape(rows.shape[0], -1).float()
    g = p.group_size
    s = p.scales[block, :, r].float()
    zs = s * float(1 << (p.bits - 1)) if p.zs.numel() == 0 else p.zs[block, :, r].float()
    y = q * s.repeat_interleave(g, 1) - zs.repeat_interleave(g, 1)
    if p.perm is None:
        return y
    out = torch.empty_like(y)
    out[:, p.perm] = y  # act order: the columns back in input order
    return out


def pack_w8a8(w: Int8Weights) -> PackedW8A8:
    """int8 [N, K] -> ``[N/16][K/4][16][4]`` (vpdpbusd's operand), with row sums."""
    n, k = w.q.shape
    q = _pad_rows(w.q, ROWS)
    if k % 4:
        q = F.pad(q, (0, 4 - k % 4))
    npad, kp = q.shape
    packed = q.view(npad // ROWS, ROWS, kp // 4, 4).permute(0, 2, 1, 3).contiguous()
    wsum = q.to(torch.int32).sum(1, dtype=torch.int32)
    scale = F.pad(w.weight_scale.float(), (0, npad - n))
    in_scale = -1.0 if w.input_scale is None else float(w.input_scale)
    return PackedW8A8(packed, scale.contiguous(), wsum.contiguous(), in_scale,
                      int(w.input_zero_point), n)


class X86QuantKernels(QuantKernels):
    """The compiled kernels (``torch.ops.glowlm_x86.wna16_linear`` / ``w8a8_linear``)."""

    name = "x86"

    def prepare_weight_only(self, w: WeightOnlyInt) -> PackedWeightOnly:
        step = 4 if w.bits == 4 else 2
        if w.group_size % step or w.q.shape[1] % step:
            raise ValueError(f"{w.bits}-bit weight-only kernels need a group size that is a "
                             f"multiple of {step}")
        return pack_weight_only(w)

    def weight_only(self, x: torch.Tensor, prepared: PackedWeightOnly,
                    bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if prepared.perm is not None:
            x2 = x2.index_select(1, prepared.perm)
        y = torch.ops.glowlm_x86.wna16_linear(x2, prepared.weight, prepared.scales, prepared.zs,
                                              prepared.bits, prepared.group_size, prepared.n,
                                              bias)
        return y.reshape(*x.shape[:-1], prepared.n)

    def weight_only_rows(self, prepared: PackedWeightOnly, rows: torch.Tensor
                         ) -> torch.Tensor:
        return packed_rows(prepared, rows)

    def prepare_w8a8(self, w: Int8Weights) -> PackedW8A8:
        return pack_w8a8(w)

    def w8a8(self, x: torch.Tensor, prepared: PackedW8A8, bias: torch.Tensor | None
             ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = torch.ops.glowlm_x86.w8a8_linear(x2, prepared.weight, prepared.scale, prepared.wsum,
                                             prepared.input_scale, prepared.input_zero_point,
                                             prepared.n, bias)
        return y.reshape(*x.shape[:-1], prepared.n)


X86_QUANT_KERNELS = X86QuantKernels()
SOURCE = "quant_linear.cpp"
_lock = threading.Lock()
_state: dict[str, bool] = {}


def _source(csrc: Path) -> Path | None:
    """quant_linear.cpp in the shared kernel tree (csrc/torch/) or the plugin's flat csrc."""
    repo = Path(__file__).resolve().parents[3]
    for path in (csrc / "torch" / SOURCE, csrc / SOURCE,
                 repo / "kernels" / "glowlm_kernels" / "csrc" / "torch" / SOURCE):
        if path.exists():
            return path
    return None


def _registered() -> bool:
    try:
        torch.ops.glowlm_x86.wna16_linear.default  # noqa: B018 - raises if not registered
    except (AttributeError, RuntimeError):
        return False
    return True


def load_quant_ops(isa: str) -> bool:
    """Make ``torch.ops.glowlm_x86.{wna16,w8a8}_linear`` available for ``isa``.

    When the kernel module itself lists ``quant_linear.cpp`` the ops are already there.
    Otherwise the file is compiled once on its own (same flags and include path as the
    kernel module, cached under ``GLOWLM_KERNEL_CACHE`` by a hash of the source and
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
    src = _source(Path(kb.CSRC))
    if src is None:
        raise FileNotFoundError(f"{SOURCE} is not in {kb.CSRC}")
    h = hashlib.sha256(src.read_bytes())
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
        cpp_extension.load(name=name, sources=[str(src)], extra_cflags=flags,
                           extra_ldflags=["-fopenmp"], extra_include_paths=[str(kb.CSRC)],
                           build_directory=str(build_dir), is_python_module=False,
                           verbose=False)
    if not _registered():
        torch.ops.load_library(str(so))


def _kernels_for(platform: Platform) -> QuantKernels:
    if isinstance(platform, X86Platform):
        library = platform.kernels()
        if library is not None and load_quant_ops(library.isa):
            return X86_QUANT_KERNELS
    return REFERENCE_KERNELS


def quantization_configs() -> list[type[QuantizationConfig]]:
    return for_platform(X86Platform, _kernels_for)


def register_fakes() -> None:
    """Shape-only implementations so ``torch.compile`` can trace the quantized ops."""
    if _state.get("fakes"):
        return
    _state["fakes"] = True
    reg = torch.library.register_fake

    @reg("glowlm_x86::wna16_linear")
    def _(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zs: torch.Tensor,
          bits: int, group_size: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))

    @reg("glowlm_x86::w8a8_linear")
    def _(x: torch.Tensor, weight: torch.Tensor, wscale: torch.Tensor, wsum: torch.Tensor,
          input_scale: float, input_zp: int, n: int, bias: torch.Tensor | None
          ) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))
