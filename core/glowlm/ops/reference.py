"""Pure-PyTorch reference implementations of every op a plugin may replace.

These run on any CPU and define the contract: each compiled kernel a plugin
registers is tested against the function of the same name here, with stated
tolerances. Norms and softmax accumulate in float32 whatever the input dtype,
because that is what the models were trained with and what transformers does.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * weight`` over the last dim; math in float32, result in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf.to(x.dtype) * weight) if weight.dtype == x.dtype else (xf * weight.float()).to(
        x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual += x`` then RMSNorm of the sum; returns ``(normed, new_residual)``.

    The sum is rounded to the activation dtype before the norm, as an unfused
    model in that dtype would do, so fused and unfused outputs agree bit for bit.
    """
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, rotary_dim: int, is_neox: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rotary_dim`` features of each head of q and k.

    ``query``/``key``: ``[tokens, heads, head_size]``. ``cos_sin_cache``:
    ``[max_position, rotary_dim]`` holding cos in the first half, sin in the
    second (float32). Neox style rotates the two halves; GPT-J style rotates
    interleaved pairs.
    """
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)  # [T, rot/2]
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
        if is_neox:
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((out.to(x.dtype), rest), dim=-1) if rest.numel() else out.to(x.dtype)

    return rotate(query), rotate(key)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """``x @ weight.T + bias`` on a plain ``[out, in]`` weight (the LM head, tied to the
    embedding, so never repacked): a platform may stream it faster than torch."""
    return F.linear(x, weight, bias)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` for the fused gate/up projection."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]``: the GeGLU of Gemma's fused gate/up
    projection (``gelu_pytorch_tanh``), rounded where transformers rounds (after the
    activation, then after the product)."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               eps: float) -> torch.Tensor:
    """LayerNorm over the last dim (torch's: math in float32, result in x's dtype)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation GPT-2 uses (``gelu_new``)."""
    return F.gelu(x, approximate="tanh")


def relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


#: The activations a MoE layer's experts take between gate|up and down.
MOE_ACTIVATIONS = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax-then-top-k routing, as transformers' Mixtral/Qwen-MoE/OLMoE routers do it.

    The softmax runs in float32 whatever the logits' dtype, the top-k probabilities are
    renormalized to sum to one when ``renormalize`` (Mixtral always; Qwen and OLMoE by
    ``norm_topk_prob``), then rounded to the logits' dtype. Returns ``(weights, ids)``,
    both ``[tokens, top_k]``, ids int64.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """The experts of a mixture-of-experts MLP: ``sum_k w_k * down_e(act(gate_e x) * up_e x)``.

    ``x``: ``[tokens, hidden]``; ``w13``: ``[experts, 2 * inter, hidden]`` (each expert's
    gate rows, then its up rows); ``w2``: ``[experts, hidden, inter]``; ``topk_weights``
    and ``topk_ids``: ``[tokens, top_k]``. Tokens are grouped by expert and each routed
    expert runs one GEMM over its tokens (an expert no token chose is never read), in
    ascending expert order, each product scaled by its routing weight and added into the
    output in ``x``'s dtype — the order and rounding of transformers' expert loop.
    """
    act = MOE_ACTIVATIONS[activation]
    out = torch.zeros_like(x)
    for expert, rows, weights in routed_groups(topk_weights, topk_ids, w13.shape[0]):
        h = act(F.linear(x[rows], w13[expert]))
        y = F.linear(h, w2[expert]) * weights[:, None].to(h.dtype)
        out.index_add_(0, rows, y.to(out.dtype))
    return out


def routed_groups(topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
                  ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(expert, token rows, routing weights)`` of every expert some token chose, in
    ascending expert order (tokens in their order): the grouping every implementation
    of the experts over torch matmuls shares (this reference, GGUF's quantized experts)."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    token_of = order // topk_ids.shape[1]
    weight_of = topk_weights.reshape(-1)[order]
    start = 0
    for expert, count in enumerate(counts):
        if count:
            yield expert, token_of[start:start + count], weight_of[start:start + count]
            start += count


def lora_row_slots(groups: list[tuple[int, torch.Tensor | None]], n: int) -> torch.Tensor:
    """The slot of each of ``n`` rows (-1: none) from ``groups``, as compiled LoRA ops take
    them (int64)."""
    slots = torch.full((n,), -1, dtype=torch.int64)
    for slot, rows in groups:
        if rows is None:
            slots.fill_(slot)
        else:
            slots[rows] = slot
    return slots


def lora_shrink_expand(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       groups: list[tuple[int, torch.Tensor | None]],
                       slots: torch.Tensor | None = None) -> torch.Tensor:
    """``y`` plus each group's low-rank update: for ``(slot, rows)`` in ``groups``,
    ``y[rows] += (x[rows] @ a[slot].T) @ b[slot].T`` (``rows`` None: every row).
    ``slots``: the same as one slot per row (:func:`lora_row_slots`), precomputed once per
    step for compiled ops; this reference reads ``groups`` only.

    ``x``: [n, in], ``y``: [n, out], ``a``: [slots, k, in], ``b``: [slots, out, k]
    (:class:`glowlm.lora.slots.LoRASlots`). Returns a new tensor (``y`` may be a buffer a
    kernel reuses), in ``y``'s dtype. The contract every platform's LoRA op is tested
    against (``glowlm.testing.contract.check_lora``).
    """
    out: torch.Tensor | None = None
    for slot, rows in groups:
        xs = x if rows is None else x.index_select(0, rows)
        d = torch.mm(torch.mm(xs.to(a.dtype), a[slot].t()), b[slot].t()).to(y.dtype)
        if rows is None:
            out = y + d if out is None else out.add_(d)
        elif out is None:
            out = y.index_add(0, rows, d)
        else:
            out.index_add_(0, rows, d)
    return y if out is None else out
