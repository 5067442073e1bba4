"""Quantized experts: a MoE layer whose experts stay in their checkpoint's blocks.

The experts are most of a MoE model's bytes (Qwen3-30B-A3B: 29 of 30 B parameters), so
dequantizing them at load undoes what a Q4_K_M file is for: the model grows 3.5x in
memory and decode reads 3.5x the bytes. Here every expert's ``gate|up`` and ``down``
become the canonical :class:`~glowlm.layers.quantization.kernels.WeightOnlyInt` and are
prepared once by the platform's quantized kernels, like any weight-only linear layer;
the forward groups the step's tokens by expert (the same grouping and order as core's
:func:`glowlm.ops.reference.fused_moe`) and runs each routed expert's two weight-only
matmuls over its tokens. An expert no token chose is never read, so a decode step
reads ``top_k`` experts' blocks per layer and nothing else.

Why a loop of weight-only matmuls rather than one fused kernel: at decode each routed
expert is one GEMV over its quantized blocks (the weight-only kernels already stream
those at the read bandwidth, docs/quantization.md); the loop adds one call per routed
expert and projection (16 per layer at top-8), microseconds against the hundreds the
blocks take to read.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.quantization.kernels import ACT_BLOCK, QuantKernels, WeightOnlyInt
from glowlm.ops.reference import MOE_ACTIVATIONS, routed_groups

#: The checkpoint-shaped parameters of one stacked projection (``w13`` / ``w2``).
GGUF_SUFFIXES = ("gguf_q", "gguf_scales", "gguf_zeros")


class WeightOnlyMoEMethod:
    """Experts of one MoE layer as weight-only quantized matmuls.

    ``create_weights`` registers, for ``w13`` (``[experts, 2·inter, hidden]``) and ``w2``
    (``[experts, hidden, inter]``), the checkpoint-shaped tensors of the format (with
    ``expert_parts`` and the layer's ``weight_loader`` so :class:`~glowlm.layers.moe.FusedMoE`
    loads them as it loads dense experts); ``process_weights_after_loading`` prepares each
    expert's two weights on the kernels and drops the stacked tensors.
    """

    def __init__(self, kernels: QuantKernels, formats: dict[str, tuple[int, int]],
                 act_block: int = 0) -> None:
        #: ``{"w13": (bits, group), "w2": (bits, group)}``
        self.kernels, self.formats, self.act_block = kernels, formats, act_block

    def create_weights(self, layer: nn.Module, num_experts: int, hidden: int, inter: int
                       ) -> None:
        shapes = {"w13": (num_experts, 2 * inter, hidden), "w2": (num_experts, hidden, inter)}
        for proj, (e, n, k) in shapes.items():
            group = self.formats[proj][1]
            if k % group:
                raise ModelLoadError(f"{layer.prefix}.{proj}: {k} input columns are not "
                                     f"whole groups of {group} on this rank")
            for suffix, cols, dtype in (("gguf_q", k, torch.uint8),
                                        ("gguf_scales", k // group, torch.float32),
                                        ("gguf_zeros", k // group, torch.float32)):
                p = nn.Parameter(torch.empty(e, n, cols, dtype=dtype), requires_grad=False)
                p.weight_loader = layer.weight_loader  # type: ignore[attr-defined]
                p.expert_parts = ("gate", "up") if proj == "w13" else ("down",)  # type: ignore[attr-defined]
                layer.register_parameter(f"{proj}_{suffix}", p)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        prepared: dict[str, list[Any]] = {}
        for proj, (bits, group) in self.formats.items():
            q, scales, zeros = (getattr(layer, f"{proj}_{s}").data for s in GGUF_SUFFIXES)
            act = self.act_block if q.shape[-1] % ACT_BLOCK == 0 else 0
            prepared[proj] = [
                self.kernels.prepare_weight_only(WeightOnlyInt(
                    q[e].contiguous(), scales[e].contiguous(), zeros[e].contiguous(), bits,
                    group, act_block=act))
                for e in range(q.shape[0])]
            for s in GGUF_SUFFIXES:
                delattr(layer, f"{proj}_{s}")
        layer.quant_experts = (prepared["w13"], prepared["w2"])

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum, in ``x``'s dtype (the reference's order)."""
        w13, w2 = layer.quant_experts
        act = MOE_ACTIVATIONS[layer.activation]
        out = torch.zeros_like(x)
        for expert, rows, weights in routed_groups(topk_weights, topk_ids, len(w13)):
            h = act(self.kernels.weight_only(x[rows], w13[expert], None))
            y = self.kernels.weight_only(h, w2[expert], None)
            out.index_add_(0, rows, (y * weights[:, None].to(y.dtype)).to(out.dtype))
        return out
