"""The canonical quantized weights every format turns into, and the matmuls over them.

Each format stores its integers differently (GPTQ packs eight 4-bit values along
the input dim of an int32, AWQ along the output dim in an interleaved nibble order,
compressed-tensors along the input dim with a sign offset). After loading, a linear
method unpacks them once into one of two canonical forms, so a kernel set only has
to understand these two:

- :class:`WeightOnlyInt` (W4A16, W8A16): ``w = scale * (q - zero)`` per group of
  ``group_size`` input channels, activations stay in the model dtype;
- :class:`Int8Weights` (W8A8): int8 weights with a per-output-channel scale, and
  activations quantized to int8 per token at run time (dynamic) or with a
  calibrated per-tensor scale and zero point (static); int8 x int8 products are
  summed exactly in integers.

:class:`QuantKernels` is what a platform supplies: ``prepare_*`` repacks a canonical
weight once for its kernel, the call runs it. :data:`REFERENCE_KERNELS` is the pure-
PyTorch definition the compiled kernels are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

#: int8 activations are symmetric in [-127, 127] when dynamic (vLLM's and
#: compressed-tensors' per-token rule: scale = max|x| / 127).
INT8_MAX = 127.0


@dataclass
class WeightOnlyInt:
    """``w[n, k] = scales[n, k // group_size] * (q[n, k] - zeros[n, k // group_size])``."""

    q: torch.Tensor                 #: uint8 [N, K], values in [0, 2**bits)
    scales: torch.Tensor            #: float32 [N, K // group_size]
    zeros: torch.Tensor             #: float32 [N, K // group_size], in q units
    bits: int
    group_size: int                 #: K for per-channel
    #: int64 [K] or None: with act order the columns of ``q`` are sorted by group,
    #: and ``x[:, perm]`` lines the activations up with them.
    perm: torch.Tensor | None = None
    #: 0: activations stay in the model dtype (W4A16, W8A16). ``ACT_BLOCK`` (32): they are
    #: quantized to int8 per block of 32 columns at run time (:func:`quantize_act_blocks`),
    #: as GGUF's own implementation multiplies every quantized block, so the kernels may
    #: sum integer products (``vpmaddubsw``) where no bf16 or int8 dot product exists.
    act_block: int = 0

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] in ``q``'s column order."""
        g = self.group_size
        return ((self.q.float() - self.zeros.repeat_interleave(g, 1))
                * self.scales.repeat_interleave(g, 1))


@dataclass
class Int8Weights:
    """W8A8: int8 weights ``q`` [N, K] with ``weight_scale`` [N]; activation quantization."""

    q: torch.Tensor                 #: int8 [N, K], symmetric
    weight_scale: torch.Tensor      #: float32 [N]
    #: None: dynamic per-token symmetric scales; else the static per-tensor scale.
    input_scale: float | None = None
    input_zero_point: int = 0       #: static asymmetric activations only


@dataclass
class WeightOnlyParts:
    """A prepared weight-only weight read back as ``w = scale · q − zs`` per group: the
    form another implementation of the same matmul starts from (the measured linear
    choice's candidates, :mod:`glowlm.layers.quantization.candidates`). ``zs`` is
    ``zero · scale`` exactly as the kernels hold it (no division back to ``zero``)."""

    q: torch.Tensor                 #: uint8 [N, K], in the kernels' column order (``perm``)
    scales: torch.Tensor            #: float32 [N, K // group_size]
    zs: torch.Tensor                #: float32 [N, K // group_size]
    bits: int
    group_size: int
    perm: torch.Tensor | None = None


def quantize_activations(x: torch.Tensor, input_scale: float | None, zero_point: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, K] float -> (int values as float32 [M, K], per-row scale float32 [M, 1]).

    Dynamic: ``inv = 127 / max|x_row|`` and ``q = round(x * inv)`` in float32 with
    round-half-to-even, the arithmetic the compiled kernels do, so they agree on
    every integer. Static: ``q = clamp(round(x * (1 / scale)) + zero_point, -128, 127)``.
    """
    x = x.float()
    if input_scale is None:
        amax = x.abs().amax(dim=1, keepdim=True)
        safe = torch.where(amax > 0, amax, torch.ones_like(amax))
        inv = INT8_MAX / safe
        q = torch.round(x * inv).clamp(-INT8_MAX, INT8_MAX)
        return q, torch.where(amax > 0, safe / INT8_MAX, torch.ones_like(amax))
    inv = torch.tensor(1.0 / input_scale, dtype=torch.float32)
    q = (torch.round(x * inv) + zero_point).clamp(-128, 127)
    return q, torch.full((x.shape[0], 1), float(input_scale), dtype=torch.float32)


#: Columns per int8 activation scale when a weight-only layer quantizes its activations.
ACT_BLOCK = 32
#: Activation blocks whose max|x| is below this are quantized to zeros.
TINY_AMAX = 1e-30


def quantize_act_blocks(x: torch.Tensor, block: int = ACT_BLOCK) -> torch.Tensor:
    """``x`` [M, K] -> float32 ``x̂ = d·q`` per block of ``block`` columns: the dynamic
    symmetric rule of :func:`quantize_activations` applied to each block (``d =
    max|x|/127``, ``q = round(x·127/max|x|)``), the int8 activations ggml multiplies
    quantized GGUF blocks with (its Q8_0 / Q8_1). The compiled ``wna8_linear`` computes
    ``Σ w·x̂`` from the same integers."""
    m, k = x.shape
    if k % block:
        raise ValueError(f"{k} columns are not whole blocks of {block}")
    blocks = x.float().reshape(m * k // block, block)
    # Blocks below TINY_AMAX are zeros (127 / max|x| would overflow float32), as in
    # quant_wna8.cpp.
    tiny = blocks.abs().amax(dim=1, keepdim=True) < TINY_AMAX
    q, scale = quantize_activations(torch.where(tiny, 0.0, blocks), None, 0)
    return (q * scale).reshape(m, k)


def int8_weights_as_blocks(w: Int8Weights) -> WeightOnlyInt:
    """Dynamic W8A8 as 8-bit weight-only weights with int8 activations per ``ACT_BLOCK``
    columns: ``q + 128`` with zero point 128 and the row scale as one group of K, so
    ``scale·(q' − 128)`` is the same weight exactly. The activations then get one scale
    per 32 columns instead of one per token (finer, so no less accurate); kernel sets
    whose per-token int8 path is slow (:attr:`QuantKernels.w8a8_as_blocks`) run it so."""
    if w.input_scale is not None:
        raise ValueError("only dynamic W8A8 runs as weight-only blocks")
    n, k = w.q.shape
    q = (w.q.to(torch.int16) + 128).to(torch.uint8)
    return WeightOnlyInt(q, w.weight_scale.float().reshape(n, 1).contiguous(),
                         torch.full((n, 1), 128.0), 8, k, act_block=ACT_BLOCK)


def unpermute_columns(y: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    """Columns of an act-order weight (sorted by group, ``perm``) back in input order."""
    if perm is None:
        return y
    out = torch.empty_like(y)
    out[:, perm] = y
    return out


class QuantKernels:
    """The quantized matmuls; this base class is core's pure-PyTorch reference.

    Subclasses (a plugin's compiled kernels) override all four matmul methods, and
    :meth:`weight_only_rows` when they repack (GGUF's tied LM head); ``prepare_*``
    runs once per layer after loading and may return any object, which is handed back
    to the call on every forward.
    """

    name = "reference"
    #: Whether int8 activations (:attr:`WeightOnlyInt.act_block`) are this kernel set's
    #: fast path for weight-only layers on this CPU: formats whose own arithmetic allows
    #: them (GGUF) use them by default only then. The reference is faster without.
    int8_activations = False
    #: Whether dynamic W8A8 layers run faster as 8-bit weight-only blocks with int8
    #: activations per 32 columns (:func:`int8_weights_as_blocks`) than on :meth:`w8a8`.
    w8a8_as_blocks = False

    def prepare_weight_only(self, w: WeightOnlyInt) -> Any:
        return w

    def weight_only(self, x: torch.Tensor, prepared: Any, bias: torch.Tensor | None
                    ) -> torch.Tensor:
        w: WeightOnlyInt = prepared
        x2 = x.reshape(-1, x.shape[-1]).float()
        if w.perm is not None:
            x2 = x2.index_select(1, w.perm)
        if w.act_block:
            x2 = quantize_act_blocks(x2, w.act_block)
        y = F.linear(x2, w.dequantize(), None if bias is None else bias.float())
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)

    def weight_only_rows(self, prepared: Any, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` (int64 [M]) of a prepared weight-only weight, float32 [M, K] in
        the input's column order: what an embedding lookup tied to a quantized LM head
        reads (GGUF), so no dense copy of the vocabulary is kept. A subclass whose
        ``prepare_weight_only`` repacks overrides it to read its own layout."""
        w: WeightOnlyInt = prepared
        g = w.group_size
        y = ((w.q.index_select(0, rows).float()
              - w.zeros.index_select(0, rows).repeat_interleave(g, 1))
             * w.scales.index_select(0, rows).repeat_interleave(g, 1))
        return unpermute_columns(y, w.perm)

    def weight_only_parts(self, prepared: Any) -> WeightOnlyParts:
        """A prepared weight-only weight as :class:`WeightOnlyParts` (a subclass whose
        ``prepare_weight_only`` repacks reads its own layout back)."""
        w: WeightOnlyInt = prepared
        return WeightOnlyParts(w.q, w.scales.float(), (w.zeros * w.scales).float(), w.bits,
                               w.group_size, w.perm)

    def prepare_w8a8(self, w: Int8Weights) -> Any:
        return w

    def int8_activations_of(self, x: torch.Tensor, prepared: Any
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` [M, K] as :meth:`w8a8` quantizes it for ``prepared``: int8 [M, K] and
        float32 scales [M, 1] (:func:`quantize_activations`' integers)."""
        w = self.int8_weights(prepared)
        q, scale = quantize_activations(x, w.input_scale, w.input_zero_point)
        return q.to(torch.int8), scale

    def int8_weights(self, prepared: Any) -> Int8Weights:
        """A prepared W8A8 weight as the canonical :class:`Int8Weights` (the same int8
        values, scales and activation rule), for other implementations of its integer
        products. A subclass whose ``prepare_w8a8`` repacks reads its layout back."""
        return prepared

    def w8a8(self, x: torch.Tensor, prepared: Any, bias: torch.Tensor | None) -> torch.Tensor:
        w: Int8Weights = prepared
        x2 = x.reshape(-1, x.shape[-1])
        q, scale = quantize_activations(x2, w.input_scale, w.input_zero_point)
        # Integer sums, exact in float64 (|sum| < 2**53 for any realistic K).
        acc = (q.double() - w.input_zero_point) @ w.q.double().T
        y = (acc * scale.double() * w.weight_scale.double()).float()
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)


REFERENCE_KERNELS = QuantKernels()
