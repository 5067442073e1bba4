"""What every model provides to the runner, and the shared weight-loading loop."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from glowlm.attention.backend import AttentionMetadata
from glowlm.errors import ModelLoadError
from glowlm.layers.fused import FusedStack

#: (fused parameter name, checkpoint name, shard id)
StackedMapping = list[tuple[str, str, str | int]]

#: One expert's projection in a checkpoint, ``...experts.<e>.<proj>.weight``, or every
#: expert's stacked in one tensor (GGUF), ``...experts.<proj>.weight``.
#: A natively run GGUF expert tensor arrives as its blocks, ``...experts.<proj>.gguf_q``
#: (and ``gguf_scales``, ``gguf_zeros``), for ``w13_gguf_q`` ...
#: (:mod:`glowlm.layers.quantization.moe`).
_EXPERT = re.compile(r"\.experts\.(?:(\d+)\.)?(\w+?)\.(weight|gguf_q|gguf_scales|gguf_zeros)$")


class CausalLM(nn.Module):
    """A decoder-only model: tokens + positions + paged cache -> hidden -> logits.

    Subclasses set ``stacked_params`` (checkpoint tensors fused into one of our
    parameters) and may override :meth:`rename` to map checkpoint names onto
    their parameter names. ``num_layers``, ``num_kv_heads`` and ``head_size``
    describe the KV cache the runner must allocate (per rank).
    """

    stacked_params: StackedMapping = []
    num_layers: int
    num_kv_heads: int
    head_size: int

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                output_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states of every token, or of ``output_rows`` only, in that order.

        The runner passes ``output_rows`` (int64 token indices) when it needs the
        logits of fewer rows than it computes, as in a prefill, where only the last
        token is sampled. A model then runs its last layer's MLP on those rows alone:
        every layer's keys and values are still written for all tokens, and nothing
        after the last attention mixes rows (for llama-1b and 128 prompt tokens, 5 %
        of the prefill's FLOPs). :func:`prune_rows` is the usual way to apply it.
        """
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def rename(self, name: str) -> str | None:
        """Checkpoint name -> parameter name; None to skip the tensor."""
        return name

    def load_weights(self, weights: Iterable[tuple[str, Callable[[], torch.Tensor]]],
                     progress: Callable[[], None] | None = None,
                     loaded: set[str] | None = None) -> set[str]:
        """Copy checkpoint tensors into parameters, one tensor in memory at a time.

        ``weights`` yields ``(name, load)`` where ``load()`` reads that tensor only
        when it is needed. Returns the parameter names that were filled (``loaded``,
        when given, is filled as the tensors arrive: the loader repacks each quantized
        layer once it is complete); the caller checks nothing is missing.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set() if loaded is None else loaded
        for raw_name, load in weights:
            if progress:
                progress()
            name = self.rename(raw_name)
            if name is None:
                continue
            expert = _expert_target(name, params)
            if expert is not None:
                target, (index, part) = expert
                # The local experts it filled (expert parallelism holds a rank's own).
                filled = params[target].weight_loader(params[target], load(), (index, part))
                loaded.update(f"{target}#{e}.{part}" for e in filled)
                continue
            for fused, part, shard in self.stacked_params:
                if f".{part}." in name:
                    target = name.replace(f".{part}.", f".{fused}.")
                    if target in params:
                        param = params[target]
                        param.weight_loader(param, load(), shard)
                        loaded.add(f"{target}#{shard}")
                        break
            else:
                if name not in params:
                    continue  # buffers and tensors we derive (rotary inv_freq, masks)
                param = params[name]
                loader = getattr(param, "weight_loader", None)
                tensor = load()
                if loader is not None:
                    loader(param, tensor)
                else:
                    if param.shape != tensor.shape:
                        raise ModelLoadError(f"tensor {raw_name!r} has shape "
                                             f"{tuple(tensor.shape)} but the model expects "
                                             f"{tuple(param.shape)}")
                    param.data.copy_(tensor)
                loaded.add(name)
                # A fused checkpoint tensor (Phi-3's qkv_proj, gate_up_proj) fills every
                # shard of its parameter; the linear's loader splits it under TP.
                head = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
                loaded.update(f"{name}#{shard}" for f, _, shard in self.stacked_params
                              if f == head)
        return loaded

    def expected_names(self) -> set[str]:
        """Names :meth:`load_weights` must report for the model to be complete."""
        names: set[str] = set()
        fused = {f for f, _, _ in self.stacked_params}
        for name, param in self.named_parameters():
            head = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
            parts = getattr(param, "expert_parts", None)
            if parts is not None:  # stacked experts: every expert's every projection
                names.update(f"{name}#{e}.{p}" for e in range(param.shape[0]) for p in parts)
            elif head in fused:
                for f, _, shard in self.stacked_params:
                    if f == head:
                        names.add(f"{name}#{shard}")
            else:
                names.add(name)
        return names


def _expert_target(name: str, params: dict[str, torch.Tensor]
                   ) -> tuple[str, tuple[int | None, str]] | None:
    """An expert checkpoint tensor's stacked parameter and ``(expert, part)``
    (:class:`glowlm.layers.moe.FusedMoE`; expert None: all of them), or None when
    ``name`` is not one."""
    m = _EXPERT.search(name)
    if m is None:
        return None
    from glowlm.layers.moe import EXPERT_PARTS

    part = EXPERT_PARTS.get(m[2])
    if part is None:
        return None
    suffix = "" if m[3] == "weight" else f"_{m[3]}"
    target = f"{name[:m.start()]}.experts.{'w2' if part == 'down' else 'w13'}{suffix}"
    return (target, (None if m[1] is None else int(m[1]), part)) if target in params else None


def prune_rows(rows: torch.Tensor | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` restricted to ``rows`` (all of them when ``rows`` is None)."""
    if rows is None:
        return tensors
    return tuple(t.index_select(0, rows) for t in tensors)


def run_layers(stack: FusedStack[Any], layers: Sequence[nn.Module], x: torch.Tensor,
               kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
               output_rows: torch.Tensor | None) -> torch.Tensor:
    """Decoder layers that map ``x`` to ``x`` (OPT, GPT-2): every layer in the stack op
    when the platform has one, else one by one; with ``output_rows`` the last layer
    runs by itself and keeps only those rows past its attention (:meth:`CausalLM.forward`).
    """
    prune = output_rows is not None
    out = stack(x, kv_caches=kv_caches, metadata=metadata, skip_last=prune)
    if out is not None:
        x = out
    else:
        for layer in layers[:-1] if prune else layers:
            x = layer(x, kv_caches, metadata)
    if prune:
        x = layers[-1](x, kv_caches, metadata, output_rows)
    return x
