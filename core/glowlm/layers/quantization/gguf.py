"""GGUF's block formats run natively as weight-only int: every block an exact group.

Every GGUF block type glowlm runs natively stores, per group of 16 or 32 weights of one
row, small unsigned integers ``q``, a scale and an offset, and its weights are
``w = scale·q + offset``, evaluated in float32 by the ``gguf`` package's ``dequantize``
(ggml's ``dequantize_row_*``) with the product ``scale·q`` exact:

========  ==========================================  ===========  =============
type      a group's ``scale`` and ``offset``          values       kernel form
========  ==========================================  ===========  =============
Q4_0      ``d``, ``−8d``                              4-bit        4-bit, g32
Q4_1      ``d``, ``m``                                4-bit        4-bit, g32
Q8_0      ``d``, ``−128d`` (``q + 128``)              8-bit        8-bit, g32
Q5_0      ``d``, ``−16d``                             5-bit        8-bit, g32
Q5_1      ``d``, ``m``                                5-bit        8-bit, g32
Q2_K      ``d·sc``, ``−dmin·m`` (4-bit sc, m)         2-bit        4-bit, g16
Q3_K      ``d·sc``, ``−4·d·sc`` (signed 6-bit sc)     3-bit        4-bit, g16
Q4_K      ``d·sc``, ``−dmin·m`` (6-bit sc, m)         4-bit        4-bit, g32
Q5_K      ``d·sc``, ``−dmin·m`` (6-bit sc, m)         5-bit        8-bit, g32
Q6_K      ``d·sc``, ``−32·d·sc`` (int8 sc)            6-bit        8-bit, g16
========  ==========================================  ===========  =============

(``d``, ``dmin``, ``m`` of the 32-weight types are f16; ``sc``/``m`` of the K-quants are
per 16- or 32-weight sub-block of a 256-weight super-block.) Each is the canonical
:class:`WeightOnlyInt` ``w = scale·(q − zero)`` with that group size:

* **Integer zero** (Q4_0, Q8_0, Q5_0, Q3_K, Q6_K): ``zero`` is the constant 8, 128, 16,
  4 or 32, moved to the kernel's midpoint (8 or 128) with ``q`` shifted by the same
  integer. Every product and difference is exact in float32 (at most 24 significant
  bits), so ``scale·(q − zero)`` and ``scale·q − zero·scale`` both equal gguf's values
  **bitwise**.
* **Float zero** (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): ``zero = −offset/scale``. Kernels that
  precompute ``zs = zero·scale`` and evaluate ``scale·q − zs`` (the x86 ones) do gguf's
  own single rounding wherever ``fl(zero·scale) == −offset``, which holds for about 90 %
  of groups: **bitwise** there; elsewhere ``zs`` is one float32 ulp of ``offset`` away
  (no float32 ``zero`` reaches it: ``fl(z·scale)`` moves in steps of up to two ulps;
  trying the quotient's neighbours was measured to gain nothing). The reference
  ``(q − zero)·scale`` is within float32 rounding of gguf's values. A group whose scale
  is 0 holds one value, ``offset``, and becomes ``scale 1, q 0, zero −offset`` (exact).

Values that fit in fewer bits than the kernel's run in the wider kernel unchanged (a
5-bit value is an 8-bit one), and a 32-weight group is two 16-weight groups with the
same scale and zero, so a fused layer whose parts are different types (Gemma 3 270M's
q/k Q5_0 with v Q8_0; a 4-bit and an 8-bit part) runs as one format: the widest bits and
the smallest group of its parts (:func:`layer_format`).

The config is not in the file: :func:`glowlm.model_loader.gguf.native_quant_config`
builds it from the header, and the engine uses it only where the platform implements
``gguf``; elsewhere, for other types (IQ*, TQ*), and with ``GLOWLM_GGUF_NATIVE=0``,
tensors are dequantized at load. The LM head — tied to the embedding or the file's own
``output.weight`` — is one of these layers when its type is (:meth:`GGUFConfig.lm_head_method`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.kernels import (
    ACT_BLOCK,
    REFERENCE_KERNELS,
    QuantKernels,
    WeightOnlyInt,
)
from glowlm.layers.quantization.method import QuantLinearMethod, add_param, check_divisible
from glowlm.layers.quantization.moe import WeightOnlyMoEMethod
from glowlm.ops.linear import LinearMethod

GROUP = 32
#: GGUF tensor types run natively: (kernel bits, group size) of their canonical form.
NATIVE_TYPES: dict[str, tuple[int, int]] = {
    "Q4_0": (4, 32), "Q4_1": (4, 32), "Q8_0": (8, 32), "Q5_0": (8, 32), "Q5_1": (8, 32),
    "Q2_K": (4, 16), "Q3_K": (4, 16), "Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16),
}
#: Bytes per block and weights per block of each native type (ggml's block_* structs).
BLOCK_LAYOUT: dict[str, tuple[int, int]] = {
    "Q4_0": (18, 32), "Q4_1": (20, 32), "Q8_0": (34, 32), "Q5_0": (22, 32), "Q5_1": (24, 32),
    "Q2_K": (84, 256), "Q3_K": (110, 256), "Q4_K": (144, 256), "Q5_K": (176, 256),
    "Q6_K": (210, 256),
}


def layer_format(types: Iterable[str]) -> tuple[int, int]:
    """(bits, group) one layer whose parts have GGUF ``types`` runs as: the widest bits
    and the smallest group (every native group size divides 32)."""
    formats = [NATIVE_TYPES[t] for t in types]
    return max(b for b, _ in formats), min(g for _, g in formats)


class GGUFConfig(QuantizationConfig):
    """``{"quant_method": "gguf", "layers": {prefix: [bits, group]}}``: the natively run
    layers (a bare ``bits`` means group 32). ``lm_head`` among them: the LM head too."""

    name = "gguf"

    def __init__(self, layers: dict[str, tuple[int, int]]) -> None:
        super().__init__()
        self.layers = layers

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GGUFConfig:
        layers = config.get("layers")
        bad = ModelLoadError("gguf quantization_config needs 'layers': {prefix: [4 or 8, "
                             "group size]}")
        if not isinstance(layers, dict):
            raise bad
        out: dict[str, tuple[int, int]] = {}
        for k, v in layers.items():
            bits, group = (v, GROUP) if isinstance(v, int) else tuple(v)
            if bits not in (4, 8) or not isinstance(group, int) or group <= 0 or group % 4:
                raise bad
            out[str(k)] = (int(bits), int(group))
        return cls(out)

    def linear_method(self, prefix: str) -> LinearMethod | None:
        return self._method(prefix)

    def lm_head_method(self, prefix: str) -> GGUFLinearMethod | None:
        return self._method(prefix)

    def moe_method(self, prefix: str) -> WeightOnlyMoEMethod | None:
        """The experts at ``prefix`` run natively when both their stacked projections
        are native layers (``<prefix>.w13``: gate and up; ``<prefix>.w2``: down)."""
        formats = {p: self.layers.get(f"{prefix}.{p}") for p in ("w13", "w2")}
        if any(f is None for f in formats.values()):
            return None
        kernels = self.kernels()
        group = min(f[1] for f in formats.values() if f is not None)
        return WeightOnlyMoEMethod(kernels, formats,  # type: ignore[arg-type]
                                   act_block=act_block(kernels, group))

    def _method(self, prefix: str) -> GGUFLinearMethod | None:
        fmt = self.layers.get(prefix)
        if fmt is None:
            return None
        kernels = self.kernels()
        return GGUFLinearMethod(*fmt, kernels, act_block=act_block(kernels, fmt[1]))


def act_block(kernels: QuantKernels, group: int) -> int:
    """The int8 activation block of a GGUF layer in ``group``-weight groups on
    ``kernels``: ``ACT_BLOCK`` where ``GLOWLM_GGUF_INT8_ACTIVATIONS`` says so (auto: where
    the kernels' fast path is int8, ``QuantKernels.int8_activations``), else 0. ggml
    itself multiplies every one of these block types by int8 activations (Q8_0/Q8_1/
    Q8_K), so either is the file's arithmetic: int8 is ggml's, 0 the more precise one."""
    from glowlm import envs
    from glowlm.layers.quantization.method import groups_fit_blocks, int8_wanted

    wanted = int8_wanted(kernels, envs.get().gguf_int8_activations)
    return ACT_BLOCK if wanted and groups_fit_blocks(group) else 0


class GGUFLinearMethod(QuantLinearMethod):
    """Parameters as the GGUF loader yields them: ``gguf_q`` (uint8 values, one per
    weight), ``gguf_scales`` and ``gguf_zeros`` (float32, one per ``group`` weights)."""

    param_names = ("gguf_q", "gguf_scales", "gguf_zeros")
    weight_only_int8_env = False  # GLOWLM_GGUF_INT8_ACTIVATIONS decides (act_block)

    def __init__(self, bits: int, group: int, kernels: QuantKernels, act_block: int = 0
                 ) -> None:
        super().__init__(kernels)
        self.bits = bits
        self.group = group
        self.act_block = act_block  #: int8 activations per this many columns (0: none)

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        check_divisible(input_size, self.group, "input size", getattr(layer, "prefix", "?"))
        n = sum(output_partition_sizes)
        add_param(layer, "gguf_q", (n, input_size), torch.uint8, output_dim=0, input_dim=1)
        for name in ("gguf_scales", "gguf_zeros"):
            add_param(layer, name, (n, input_size // self.group), torch.float32,
                      output_dim=0, input_dim=1)

    def canonical(self, layer: nn.Module) -> WeightOnlyInt:
        act = self.act_block if layer.gguf_q.shape[1] % ACT_BLOCK == 0 else 0
        return WeightOnlyInt(layer.gguf_q.data.contiguous(), layer.gguf_scales.data.contiguous(),
                             layer.gguf_zeros.data.contiguous(), self.bits, self.group,
                             act_block=act)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        canon = self.canonical(layer)
        super().process_weights_after_loading(layer)
        repacked = not isinstance(layer.quant_weight, WeightOnlyInt)
        if (getattr(layer, "row_lookup", False) and repacked
                and type(self.kernels).weight_only_rows is QuantKernels.weight_only_rows):
            # A kernel set that repacks but cannot read rows of its layout: the tied
            # embedding keeps the canonical values (more memory, still no dense copy).
            layer.row_weight = canon

    def lookup(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the weight as float32 (the embedding lookup of a tied head)."""
        canon = getattr(layer, "row_weight", None)
        if canon is not None:
            return REFERENCE_KERNELS.weight_only_rows(canon, ids)
        return self.kernels.weight_only_rows(layer.quant_weight, ids)


# -- the blocks ----------------------------------------------------------------------

_SHIFT2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
_SHIFT4 = torch.tensor([0, 4], dtype=torch.uint8)
_SHIFT1 = torch.arange(8, dtype=torch.uint8)


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte ``at`` of every block, as float32 ``[blocks, 1]``."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, chunk: int) -> torch.Tensor:
    """Bytes ``[blocks, n]`` in chunks of ``chunk``: each chunk's low nibbles, then its
    high ones (ggml's order) -> ``[blocks, 2n]``."""
    nb = qs.shape[0]
    return ((qs.view(nb, -1, 1, chunk) >> _SHIFT4.view(1, 1, 2, 1)) & 0x0F).reshape(nb, -1)


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """2-bit fields: each 32-byte chunk's bits 0-1, 2-3, 4-5, 6-7 in turn -> 4x values."""
    nb = qs.shape[0]
    return ((qs.view(nb, -1, 1, 32) >> _SHIFT2.view(1, 1, 4, 1)) & 0x03).reshape(nb, -1)


def _bitplanes(qh: torch.Tensor) -> torch.Tensor:
    """32 bytes -> 256 bits: bit ``j`` of byte ``l`` is value ``32·j + l``."""
    nb = qh.shape[0]
    return ((qh.view(nb, 1, 32) >> _SHIFT1.view(1, 8, 1)) & 0x01).reshape(nb, 256)


def _qh32(qh: torch.Tensor) -> torch.Tensor:
    """A little-endian uint32 of 32 high bits (Q5_0/Q5_1) -> ``[blocks, 32]``, bit i = value i."""
    nb = qh.shape[0]
    return ((qh.view(nb, 4, 1) >> _SHIFT1.view(1, 1, 8)) & 0x01).reshape(nb, 32)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins (ggml's get_scale_min_k4)."""
    nb = s.shape[0]
    d, m, md = s.view(nb, 3, 4).unbind(1)
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def groups(data: Any, type_name: str
           ) -> tuple[torch.Tensor, torch.Tensor, float | None, torch.Tensor | None]:
    """A native type's blocks as groups: ``(q uint8 [G, g], scale float32 [G], zero,
    offset)`` in row-major order, ``w = scale·q + offset``. ``zero`` is the integer zero
    point of the types that have one (then ``offset = −zero·scale`` and is None), else
    None and ``offset`` float32 [G]."""
    import numpy as np

    if type_name not in BLOCK_LAYOUT:
        raise ModelLoadError(f"GGUF type {type_name} is not run natively")
    nbytes, _ = BLOCK_LAYOUT[type_name]
    raw = np.asarray(data).reshape(-1)
    if raw.size % nbytes:
        raise ValueError(f"{raw.size} bytes is not a whole number of {nbytes}-byte blocks")
    # A copy: the reader's arrays are read-only views of the memory-mapped file.
    b = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True)).view(-1, nbytes)
    nb = b.shape[0]
    if type_name == "Q8_0":
        q = (b[:, 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8)
        return q, _f16(b, 0).reshape(-1), 128.0, None
    if type_name == "Q4_0":
        return _nibbles(b[:, 2:], 16), _f16(b, 0).reshape(-1), 8.0, None
    if type_name == "Q4_1":
        return _nibbles(b[:, 4:], 16), _f16(b, 0).reshape(-1), None, _f16(b, 2).reshape(-1)
    if type_name == "Q5_0":
        q = _nibbles(b[:, 6:], 16) | (_qh32(b[:, 2:6]) << 4)
        return q, _f16(b, 0).reshape(-1), 16.0, None
    if type_name == "Q5_1":
        q = _nibbles(b[:, 8:], 16) | (_qh32(b[:, 4:8]) << 4)
        return q, _f16(b, 0).reshape(-1), None, _f16(b, 2).reshape(-1)
    if type_name == "Q2_K":
        sc = b[:, :16]
        q = _crumbs(b[:, 16:80]).view(nb * 16, 16)
        scale = _f16(b, 80) * (sc & 0x0F).float()
        offset = -(_f16(b, 82) * (sc >> 4).float())
        return q, scale.reshape(-1), None, offset.reshape(-1)
    if type_name == "Q3_K":
        low = (b[:, 96:104].view(nb, 1, 8) >> _SHIFT4.view(1, 2, 1)) & 0x0F
        high = (b[:, 104:108].view(nb, 1, 4) >> _SHIFT2.view(1, 4, 1)) & 0x03
        sc = (low.reshape(nb, 16) | (high.reshape(nb, 16) << 4)).float() - 32.0
        # ggml: q = low2 − 4·(1 − hbit), so q + 4 = low2 + 4·hbit in [0, 8).
        q = _crumbs(b[:, 32:96]) + (_bitplanes(b[:, :32]) << 2)
        return q.view(nb * 16, 16), (_f16(b, 108) * sc).reshape(-1), 4.0, None
    if type_name in ("Q4_K", "Q5_K"):
        sc, mn = _k_scales(b[:, 4:16])
        if type_name == "Q4_K":
            q = _nibbles(b[:, 16:144], 32)
        else:
            q = _nibbles(b[:, 48:176], 32) | (_bitplanes(b[:, 16:48]) << 4)
        scale = _f16(b, 0) * sc
        offset = -(_f16(b, 2) * mn)
        return q.view(nb * 8, 32), scale.reshape(-1), None, offset.reshape(-1)
    # Q6_K: 128 bytes of low nibbles (64-byte chunks), 64 of 2-bit highs, 16 int8 scales.
    q = _nibbles(b[:, :128], 64) | (_crumbs(b[:, 128:192]) << 4)
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    return q.view(nb * 16, 16), (_f16(b, 208) * sc).reshape(-1), 32.0, None


def split_blocks(data: Any, type_name: str, shape: tuple[int, ...], group: int | None = None,
                 bits: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GGUF tensor of a native type -> (q uint8 [N, K], scales, zeros float32
    [N, K/group]) for a ``bits``-bit kernel in ``group``-weight groups (defaults: the
    type's own; ``group`` must divide the type's, ``bits`` hold its values).

    The integer zero points are moved to the kernel's midpoint ``2**(bits-1)`` (``q``
    shifted by the same integer: Q5_0's ``q − 16`` is ``(q + 112) − 128``), so every
    integer-zero layer is symmetric in the kernel's terms (kernels may then skip the
    ``zero·scale`` stream). ``WeightOnlyInt(q, scales, zeros)`` gives gguf's
    ``dequantize(data)`` as the module docstring says: bitwise for the integer-zero
    types; for the float-zero ones ``scale·q − fl(zero·scale)`` is bitwise except that
    ``fl(zero·scale)`` may be one float32 ulp from the block's offset (about 10 % of
    groups).
    """
    n, k = shape
    own_bits, own = NATIVE_TYPES.get(type_name, (0, 0))
    group, bits = group or own, bits or own_bits
    if type_name not in NATIVE_TYPES or own % group or bits < own_bits:
        raise ModelLoadError(f"GGUF type {type_name} does not run natively as {bits}-bit "
                             f"groups of {group}")
    if k % BLOCK_LAYOUT[type_name][1]:
        raise ValueError(f"rows of {k} weights are not whole {type_name} blocks")
    q, scale, zero, offset = groups(data, type_name)
    if zero is not None:
        mid = 1 << (bits - 1)
        if zero != mid:
            q = (q.to(torch.int16) + int(mid - zero)).to(torch.uint8)
        zeros = torch.full_like(scale, float(mid))
    else:
        assert offset is not None
        flat = scale == 0
        if bool(flat.any()):  # one value per group: scale 1, q 0, zero −offset
            q = torch.where(flat.unsqueeze(1), torch.zeros_like(q), q)
            scale = torch.where(flat, torch.ones_like(scale), scale)
        zeros = -offset / scale  # flat groups: scale 1, so −offset
    if q.numel() != n * k:
        raise ValueError(f"{q.numel()} weights in the blocks, {n * k} in the shape")
    scale, zeros = scale.view(n, k // own), zeros.view(n, k // own)
    if group != own:
        scale = scale.repeat_interleave(own // group, dim=1)
        zeros = zeros.repeat_interleave(own // group, dim=1)
    return q.reshape(n, k).contiguous(), scale.contiguous(), zeros.contiguous()
