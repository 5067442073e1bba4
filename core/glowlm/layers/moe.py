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
    ``[experts, hidden, inter]``, dense in the model dtype or, where the checkpoint's
    quantization config says (``QuantizationConfig.moe_method``), in its quantized blocks.

    Under TP each rank holds its slice of ``inter`` of every expert; with expert
    parallelism (``--enable-expert-parallel``, ``ModelParts.expert_parallel``) it holds
    ``experts / tp`` whole experts instead and runs only the (token, expert) pairs routed
    to them. Either way the ranks' partial sums are all-reduced. Why both: slicing keeps
    every rank busy on every token but splits each expert's GEMM into ``tp`` narrower ones;
    whole experts keep the GEMMs wide (prefill) at the cost of load balance (a rank whose
    experts the step's tokens avoid waits at the all-reduce).
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, parts: ModelParts, prefix: str,
                 activation: str = "silu") -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ModelLoadError(f"{prefix}: {top_k} experts per token out of {num_experts}")
        self.prefix = prefix
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size = hidden_size
        self.activation = activation
        self.parallel = parts.parallel
        tp, rank = parts.parallel.tp_size, parts.parallel.tp_rank
        self.expert_parallel = parts.expert_parallel and tp > 1
        if self.expert_parallel:
            #: this rank's experts: ``first_expert ... first_expert + local_experts - 1``
            self.local_experts = divide(num_experts, tp, f"{prefix}: the experts "
                                        "(--enable-expert-parallel)")
            self.first_expert = rank * self.local_experts
            self.inter = intermediate_size
        else:
            self.local_experts, self.first_expert = num_experts, 0
            self.inter = divide(intermediate_size, tp, f"{prefix}: the experts' "
                                "intermediate size")
        local = self.local_experts
        self.fn = parts.ops.fused_moe
        #: quantized experts (:mod:`glowlm.layers.quantization.moe`), or None: dense
        self.method = (parts.quant_config.moe_method(prefix)
                       if parts.quant_config is not None else None)
        if self.method is not None:
            self.method.create_weights(self, local, hidden_size, self.inter)
            return
        self.w13 = nn.Parameter(torch.empty(local, 2 * self.inter, hidden_size,
                                            dtype=parts.dtype), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(local, hidden_size, self.inter,
                                           dtype=parts.dtype), requires_grad=False)
        for p, names in ((self.w13, ("gate", "up")), (self.w2, ("down",))):
            p.weight_loader = self.weight_loader  # type: ignore[attr-defined]
            #: what the loader must fill for every expert (``CausalLM.expected_names``)
            p.expert_parts = names  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: tuple[int | None, str]) -> list[int]:
        """``shard_id = (expert, part)``: one expert's ``gate``/``up`` ``[inter, hidden]``
        or ``down`` ``[hidden, inter]`` (safetensors), or with ``expert=None`` every
        expert's at once, ``[experts, ...]`` (GGUF's stacked tensors). Returns the local
        experts filled (none: an expert another rank holds under expert parallelism)."""
        expert, part = shard_id
        rank = 0 if self.expert_parallel else self.parallel.tp_rank
        name = f"{self.prefix}[{'*' if expert is None else expert}].{part}"
        first, local = self.first_expert, self.local_experts
        if expert is None:
            target, filled = param.data, list(range(local))
            loaded = loaded.narrow(0, first, local)
        elif first <= expert < first + local:
            target, filled = param.data[expert - first], [expert - first]
        else:
            return []
        # This rank's rows of gate/up and columns of down; the same slicing for a
        # quantized expert's blocks, whose columns are values or per-group scales.
        if part in ("gate", "up"):
            n = target.shape[-2] // 2
            off = 0 if part == "gate" else n
            copy_checked(target.narrow(-2, off, n), loaded.narrow(-2, rank * n, n), name)
        elif part == "down":
            c = target.shape[-1]
            copy_checked(target, loaded.narrow(-1, rank * c, c), name)
        else:
            raise ModelLoadError(f"{name}: unknown expert projection {part!r}")
        return filled

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_route(router_logits, self.top_k, self.renormalize)
        if self.expert_parallel:
            return self.parallel.all_reduce(self._local_pairs(x, weights, ids))
        return self.parallel.all_reduce(self._experts(x, weights, ids))

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                 ) -> torch.Tensor:
        if self.method is not None:
            return self.method.apply(self, x, weights, ids)
        return self.fn(x, self.w13, self.w2, weights, ids, self.activation)

    def _local_pairs(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                     ) -> torch.Tensor:
        """Expert parallelism: the (token, expert) pairs routed to this rank's experts,
        each as a row of its own with one expert, summed back into the token's row."""
        local = ids - self.first_expert
        mine = (local >= 0) & (local < self.local_experts)
        out = torch.zeros_like(x)
        pairs = mine.nonzero()
        if pairs.numel():
            tokens, slot = pairs[:, 0], pairs[:, 1]
            y = self._experts(x.index_select(0, tokens), weights[tokens, slot, None],
                              local[tokens, slot, None])
            out.index_add_(0, tokens, y)
        return out


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
