"""Mixture-of-experts MLPs: a router, the routed experts, and an optional shared expert.

A token reads only the experts its router picks (8 of 128 in Qwen3-30B-A3B), so on a
bandwidth-bound CPU a MoE model decodes at the speed of its active parameters. The
experts' weights are stacked, all experts of a layer in two tensors (``w13``: each
expert's gate and up rows; ``w2``: its down projection), so the platform's
``fused_moe`` op groups the step's tokens by expert and runs one GEMM per routed
expert over its tokens; core's reference (:func:`glowlm.ops.reference.fused_moe`) is
the contract every platform's kernel is tested against.

Routing is transformers' arithmetic (:func:`glowlm.ops.reference.moe_route`): router
logits in the model dtype, softmax in float32, top-k, renormalized where the family
says. Under tensor parallelism every rank holds its slice of every expert's
intermediate dimension and the outputs are summed, as a row-parallel layer's.
"""

from __future__ import annotations

import torch
from torch import nn

from glowlm.distributed.parallel import divide
from glowlm.errors import ModelLoadError
from glowlm.layers.activation import SiluAndMul
from glowlm.layers.context import ModelParts
from glowlm.layers.linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from glowlm.layers.weights import copy_checked
from glowlm.ops.reference import moe_route

#: Checkpoint names of an expert's three projections -> (our tensor, part).
EXPERT_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down",
                "w1": "gate", "w3": "up", "w2": "down"}


class FusedMoE(nn.Module):
    """The routed experts of one layer: ``[experts, 2 * inter, hidden]`` and
    ``[experts, hidden, inter]`` (this rank's slice of ``inter`` under TP)."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, parts: ModelParts, prefix: str,
                 activation: str = "silu") -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ModelLoadError(f"{prefix}: {top_k} experts per token out of {num_experts}")
        self.prefix = prefix
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.activation = activation
        self.parallel = parts.parallel
        self.inter = divide(intermediate_size, parts.parallel.tp_size,
                            f"{prefix}: the experts' intermediate size")
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.inter, hidden_size,
                                            dtype=parts.dtype), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.inter,
                                           dtype=parts.dtype), requires_grad=False)
        for p, names in ((self.w13, ("gate", "up")), (self.w2, ("down",))):
            p.weight_loader = self.weight_loader  # type: ignore[attr-defined]
            #: what the loader must fill for every expert (``CausalLM.expected_names``)
            p.expert_parts = names  # type: ignore[attr-defined]
        self.fn = parts.ops.fused_moe

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: tuple[int | None, str]) -> None:
        """``shard_id = (expert, part)``: one expert's ``gate``/``up`` ``[inter, hidden]``
        or ``down`` ``[hidden, inter]`` (safetensors), or with ``expert=None`` every
        expert's at once, ``[experts, ...]`` (GGUF's stacked tensors)."""
        expert, part = shard_id
        rank, n = self.parallel.tp_rank, self.inter
        name = f"{self.prefix}[{'*' if expert is None else expert}].{part}"
        target = param.data if expert is None else param.data[expert]
        if part in ("gate", "up"):
            off = 0 if part == "gate" else n
            copy_checked(target.narrow(-2, off, n), loaded.narrow(-2, rank * n, n), name)
        elif part == "down":
            copy_checked(target, loaded.narrow(-1, rank * n, n), name)
        else:
            raise ModelLoadError(f"{name}: unknown expert projection {part!r}")

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_route(router_logits, self.top_k, self.renormalize)
        out = self.fn(x, self.w13, self.w2, weights, ids, self.activation)
        return self.parallel.all_reduce(out)


class SharedExpert(nn.Module):
    """Qwen2-MoE's dense expert every token also runs, scaled by ``sigmoid(gate(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, parts: ModelParts,
                 prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], False, parts,
            f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, False, parts,
                                           f"{prefix}.down_proj")
        self.act = SiluAndMul(parts)


class MoEMLP(nn.Module):
    """Router + routed experts (+ a shared expert): the MLP of a MoE decoder layer.

    Parameter names follow the checkpoints: ``gate`` (the router), ``experts``,
    ``shared_expert`` and ``shared_expert_gate`` (Qwen2-MoE)."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
                 renormalize: bool, parts: ModelParts, prefix: str,
                 shared_intermediate_size: int = 0) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, False, parts, f"{prefix}.gate")
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size,
                                renormalize, parts, f"{prefix}.experts")
        self.shared_expert: SharedExpert | None = None
        self.shared_expert_gate: ReplicatedLinear | None = None
        if shared_intermediate_size:
            self.shared_expert = SharedExpert(hidden_size, shared_intermediate_size, parts,
                                              f"{prefix}.shared_expert")
            self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, False, parts,
                                                       f"{prefix}.shared_expert_gate")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None:
            s = self.shared_expert
            shared = s.down_proj(s.act(s.gate_up_proj(x)))
            assert self.shared_expert_gate is not None
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * shared
        return out
