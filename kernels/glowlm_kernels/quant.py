"""The quantized matmuls of the shared kernel tree (``csrc/torch/quant_*.cpp``) as a
plugin's :class:`~glowlm.plugin_api.QuantKernels`.

Every plugin module built from the tree registers ``wna16_linear`` (weight-only int4 /
int8) and ``w8a8_linear`` (int8 x int8) under its own namespace (``torch.ops.glowlm_x86``,
``glowlm_arm``, ``glowlm_s390x``), with one prepared layout for all of them. This module
holds what is the same everywhere: the repacking (done once per layer after loading) and
:class:`CompiledQuantKernels`, bound to one namespace. A plugin's quantization hook hands
it to core's quantization configs when its compiled module loaded, core's reference
otherwise, so a quantized checkpoint always runs.

Layouts (the C++ files' headers have the why): canonical unsigned values become
``[N/16][K/4][16][2]`` nibble bytes (4 bits: each 32-byte unit 16 rows x 4 columns, the
operand order of a pairwise bf16 dot product) or ``[N/16][K/2][2][16]`` bytes (8 bits);
scales and ``zero * scale`` become ``[N/16, groups, 16]``, so the kernel reads 16
consecutive output rows per load and each block's in one stream — float16 where that
holds them exactly, and no ``zero * scale`` at all for symmetric weights, since decode
streams these bytes once per token too. W8A8 weights become ``[N/16][K/4][16][4]`` int8
(vpdpbusd's operand) with their row sums.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from glowlm.plugin_api import Int8Weights, QuantKernels, WeightOnlyInt, WeightOnlyParts

from glowlm_kernels import build

ROWS = 16  #: output rows per weight block (one AVX-512 register of fp32 / int32 sums)
#: The compiled quantized ops (a platform's ``Capabilities.kernels`` lists them).
QUANT_OP_NAMES = ("wna16_linear", "w8a8_linear", "wna8_linear")


def _pad_rows(t: torch.Tensor, rows: int, value: float = 0) -> torch.Tensor:
    extra = (-t.shape[0]) % rows
    return F.pad(t, (0, 0, 0, extra), value=value) if extra else t


@dataclass
class PackedWeightOnly:
    weight: torch.Tensor         #: uint8, blocked (quant_wna16.cpp)
    scales: torch.Tensor         #: float32 or float16 [Npad/16, G, 16]
    #: zero * scale, scales' dtype and shape; empty when symmetric (zero 2**(bits-1))
    zs: torch.Tensor
    bits: int
    group_size: int
    n: int
    perm: torch.Tensor | None
    #: int8 activations per this many columns (``wna8_linear``), 0: ``wna16_linear``.
    #: 8-bit weights then take W8A8's signed layout ``[N/16][K/4][16][4]`` (q − 128).
    act_block: int = 0


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
    bf16 dot product (quant_wna16.cpp). With int8 activations (``w.act_block``) 8-bit
    values become W8A8's ``[N/16][K/4][16][4]`` signed ``q − 128`` (vpmaddubsw's operand
    after its sign trick); 4-bit ones keep the nibble layout, already pairs of columns.
    """
    n, k = w.q.shape
    q = _pad_rows(w.q, ROWS)
    npad = q.shape[0]
    if w.bits == 4:  # unit c of 16 rows: byte 2r + j = q[r, 4c + j] | q[r, 4c + 2 + j] << 4
        units = q.view(npad // ROWS, ROWS, k // 4, 2, 2)
        packed = (units[..., 0, :] | (units[..., 1, :] << 4)).permute(0, 2, 1, 3)
    elif w.act_block:
        signed = (q.to(torch.int16) - 128).to(torch.int8)
        packed = signed.view(npad // ROWS, ROWS, k // 4, 4).permute(0, 2, 1, 3)
    else:
        packed = q.view(npad // ROWS, ROWS, k // 2, 2).permute(0, 2, 3, 1)
    scales = _pad_rows(w.scales.float(), ROWS)
    mid = float(1 << (w.bits - 1))
    # Symmetric (every zero point the midpoint): no zero * scale tensor; the kernel
    # derives it. Padded rows have scale 0, so their zero never matters.
    zeros = _pad_rows(w.zeros.float(), ROWS, value=mid)
    zs = None if bool((zeros == mid).all()) else zeros * scales
    if zs is not None and _exact_half(scales) and _near_half(zs):
        # A float zero point whose zero * scale is an fp16 number but for float32
        # rounding: GGUF's Q4_1 / Q5_1 offsets m are fp16, and zero = -m / scale gives
        # back fl(zero * scale) one float32 ulp off m in ~10 % of groups. Rounding to
        # fp16 restores m itself, so the kernels compute scale * q - m as ggml does, and
        # decode streams 2 bytes less per group (SmolLM2's Q4_1 layers: 0.625 instead
        # of 0.75 bytes per weight).
        zs = zs.half().float()
    # float16 where it holds every value exactly (GGUF's fp16 scales, bf16 scales within
    # fp16's normal range): half the bytes per group that decode streams.
    dtype = torch.float16 if all(_exact_half(t) for t in (scales, zs) if t is not None) \
        else torch.float32

    def blocked(t: torch.Tensor) -> torch.Tensor:  # [Npad, G] -> [Npad/16, G, 16]
        return t.view(npad // ROWS, ROWS, -1).permute(0, 2, 1).to(dtype).contiguous()

    return PackedWeightOnly(packed.contiguous(), blocked(scales),
                            torch.empty(0, dtype=dtype) if zs is None else blocked(zs),
                            w.bits, w.group_size, n, w.perm, w.act_block)


def _exact_half(t: torch.Tensor) -> bool:
    """Whether float32 ``t`` survives float16 bit for bit (subnormals excluded)."""
    h = t.to(torch.float16)
    tiny = (t != 0) & (t.abs() < torch.finfo(torch.float16).tiny)
    return bool(torch.equal(h.float(), t)) and not bool(tiny.any())


def _near_half(t: torch.Tensor, ulps: int = 2) -> bool:
    """Whether every value of float32 ``t`` is within ``ulps`` float32 ulps of a float16
    number (normal range): an fp16 value that went through a float32 product."""
    h = t.to(torch.float16).float()
    if not bool(torch.isfinite(h).all()):
        return False
    tiny = (t != 0) & (t.abs() < torch.finfo(torch.float16).tiny)
    a = t.abs()
    ulp = torch.nextafter(a, torch.full_like(a, float("inf"))) - a
    return not bool(tiny.any()) and bool(((h - t).abs() <= ulps * ulp).all())


def packed_rows(p: PackedWeightOnly, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` of a packed weight as float32 ``[M, K]``, ``q·scale − zs`` as the
    kernels evaluate it: a tied embedding's lookup in a quantized LM head (GGUF), read
    from the blocked layout :func:`pack_weight_only` wrote, so no other copy is kept."""
    block, r = rows // ROWS, rows % ROWS
    if p.bits == 4:  # weight [Npad/16, K/4, 16, 2]: byte j of unit c holds 4c+j | 4c+2+j
        units = p.weight[block, :, r, :]                      # [M, K/4, 2]
        q = torch.stack([units & 0x0F, units >> 4], dim=2)    # [M, K/4, lo/hi, j]
    elif p.act_block:  # weight int8 [Npad/16, K/4, 16, 4]: q - 128
        q = p.weight[block, :, r, :].float() + 128            # [M, K/4, 4]
    else:  # weight [Npad/16, K/2, 2, 16]
        q = p.weight[block, :, :, r]                          # [M, K/2, 2]
    m, g = rows.shape[0], p.group_size
    q = q.reshape(m, -1, g).float()                           # [M, G, g]
    s = p.scales[block, :, r].float()
    zs = s * float(1 << (p.bits - 1)) if p.zs.numel() == 0 else p.zs[block, :, r].float()
    # Broadcast over each group (the same products as repeat_interleave, without the
    # [M, K] copies: decode looks one row up per step).
    y = (q * s.unsqueeze(2) - zs.unsqueeze(2)).reshape(m, -1)
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


def unpack_weight_only(p: PackedWeightOnly) -> WeightOnlyParts:
    """:func:`pack_weight_only`'s layout back to ``[N, K]`` values with their scales and
    ``zero * scale`` per group (``scale * 2**(bits-1)`` for symmetric weights, as the
    kernels derive it)."""
    npad = p.scales.shape[0] * ROWS
    if p.bits == 4:  # [Npad/16, K/4, 16, 2]: byte j of unit c = q[4c + j] | q[4c + 2 + j] << 4
        b = p.weight
        q = torch.stack([b & 0x0F, b >> 4], dim=3)             # [Npad/16, K/4, 16, 2, 2]
        q = q.permute(0, 2, 1, 3, 4).reshape(npad, -1)
    elif p.act_block:  # int8 [Npad/16, K/4, 16, 4]: q - 128
        q = (p.weight.permute(0, 2, 1, 3).reshape(npad, -1).to(torch.int16) + 128
             ).to(torch.uint8)
    else:  # [Npad/16, K/2, 2, 16]
        q = p.weight.permute(0, 3, 1, 2).reshape(npad, -1)

    def rows(t: torch.Tensor) -> torch.Tensor:  # [Npad/16, G, 16] -> [N, G]
        return t.permute(0, 2, 1).reshape(npad, -1)[:p.n].float().contiguous()

    scales = rows(p.scales)
    zs = scales * float(1 << (p.bits - 1)) if p.zs.numel() == 0 else rows(p.zs)
    return WeightOnlyParts(q[:p.n].contiguous(), scales, zs, p.bits, p.group_size, p.perm)


def unpack_w8a8(p: PackedW8A8, k: int) -> Int8Weights:
    """:func:`pack_w8a8`'s layout back to the canonical int8 ``[N, K]`` weights."""
    npad = p.scale.shape[0]
    q = p.weight.permute(0, 2, 1, 3).reshape(npad, -1)[:p.n, :k].contiguous()
    return Int8Weights(q, p.scale[:p.n].clone(),
                       None if p.input_scale <= 0 else p.input_scale, p.input_zero_point)


def quant_ops_registered(namespace: str) -> bool:
    """Whether ``torch.ops.<namespace>`` has the quantized ops (its module is loaded)."""
    try:
        for op in QUANT_OP_NAMES:  # a module built before wna8_linear lacks it
            getattr(getattr(torch.ops, namespace), op).default  # noqa: B018 - raises if absent
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.cache
def source_hash() -> str:
    """The first 12 hex digits of the SHA-256 of the quantized sources and their own
    headers (``build.QUANT_SOURCES``, ``build.QUANT_HEADERS``; "unknown" without them)."""
    h = hashlib.sha256()
    try:
        for name in (*build.QUANT_SOURCES, *build.QUANT_HEADERS):
            h.update(name.encode())
            h.update((build.CSRC / name).read_bytes())
    except OSError:
        return "unknown"
    return h.hexdigest()[:12]


class CompiledQuantKernels(QuantKernels):
    """``torch.ops.<namespace>.wna16_linear`` / ``w8a8_linear`` on this module's layouts."""

    def __init__(self, namespace: str, name: str, int8_activations: bool = False,
                 w8a8_as_blocks: bool = False, isa: str = "") -> None:
        self.namespace = namespace
        self.name = name
        #: The measured linear choice's cache key part: a kernel change measures again.
        self.version = f"{namespace}-{isa}-{source_hash()}"
        #: Whether dynamic W8A8 runs as ``wna8_linear`` blocks here (QuantKernels).
        self.w8a8_as_blocks = w8a8_as_blocks
        #: Whether ``wna8_linear`` is the fast weight-only path of this module's CPU
        #: (the plugin knows its ISA; see QuantKernels.int8_activations).
        self.int8_activations = int8_activations

    def _op(self, op: str):  # noqa: ANN202 - a torch OpOverloadPacket
        return getattr(getattr(torch.ops, self.namespace), op)

    def prepare_weight_only(self, w: WeightOnlyInt) -> PackedWeightOnly:
        step = 4 if w.bits == 4 else 2
        if w.group_size % step or w.q.shape[1] % step:
            raise ValueError(f"{w.bits}-bit weight-only kernels need a group size that is a "
                             f"multiple of {step}")
        if w.act_block and (w.act_block != 32 or w.q.shape[1] % 32 or w.perm is not None
                            or not (w.group_size == 16 or w.group_size % 32 == 0)):
            raise ValueError("int8 activations need blocks of 32 columns, K a multiple of "
                             "32, groups of 16 or of a multiple of 32, and no act order")
        return pack_weight_only(w)

    def weight_only(self, x: torch.Tensor, prepared: PackedWeightOnly,
                    bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if prepared.perm is not None:
            x2 = x2.index_select(1, prepared.perm)
        op = "wna8_linear" if prepared.act_block else "wna16_linear"
        y = self._op(op)(x2, prepared.weight, prepared.scales, prepared.zs,
                         prepared.bits, prepared.group_size, prepared.n, bias)
        return y.reshape(*x.shape[:-1], prepared.n)

    def weight_only_rows(self, prepared: PackedWeightOnly, rows: torch.Tensor
                         ) -> torch.Tensor:
        return packed_rows(prepared, rows)

    def weight_only_parts(self, prepared: PackedWeightOnly) -> WeightOnlyParts:
        return unpack_weight_only(prepared)

    def prepare_w8a8(self, w: Int8Weights) -> PackedW8A8:
        return pack_w8a8(w)

    def int8_activations_of(self, x: torch.Tensor, prepared: PackedW8A8
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        op = getattr(getattr(torch.ops, self.namespace), "quantize_rows", None)
        if op is None:  # a module built before quantize_rows joined the quantized ops
            return super().int8_activations_of(x, prepared)
        return op(x, prepared.input_scale, prepared.input_zero_point)

    def int8_weights(self, prepared: PackedW8A8) -> Int8Weights:
        """The int8 values with K padded to a multiple of 4 by zero columns."""
        return unpack_w8a8(prepared, prepared.weight.shape[1] * 4)

    def w8a8(self, x: torch.Tensor, prepared: PackedW8A8, bias: torch.Tensor | None
             ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y = self._op("w8a8_linear")(x2, prepared.weight, prepared.scale, prepared.wsum,
                                    prepared.input_scale, prepared.input_zero_point,
                                    prepared.n, bias)
        return y.reshape(*x.shape[:-1], prepared.n)


_fakes: set[str] = set()


def register_fakes(namespace: str) -> None:
    """Shape-only implementations so ``torch.compile`` can trace the quantized ops."""
    if namespace in _fakes:
        return
    _fakes.add(namespace)
    reg = torch.library.register_fake

    @reg(f"{namespace}::wna16_linear")
    def _(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zs: torch.Tensor,
          bits: int, group_size: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))

    @reg(f"{namespace}::wna8_linear")
    def _(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zs: torch.Tensor,
          bits: int, group_size: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))

    @reg(f"{namespace}::w8a8_linear")
    def _(x: torch.Tensor, weight: torch.Tensor, wscale: torch.Tensor, wsum: torch.Tensor,
          input_scale: float, input_zp: int, n: int, bias: torch.Tensor | None
          ) -> torch.Tensor:
        return x.new_empty((x.shape[0], n))
