"""Adapter slots in the linear layers, and the step's row -> slot mapping.

With ``--enable-lora`` every linear layer of the decoder layers holds ``--max-loras``
slots of rank ``--max-lora-rank`` (:class:`LoRASlots`), allocated with the model and
counted by the memory plan. A layer with ``S`` fused projections (q|k|v: 3, gate|up: 2)
keeps, per slot, ``a`` of ``[S * R, in]`` (each projection's A in its own ``R`` rows) and
``b`` of ``[out, S * R]``, block-diagonal (projection ``s``'s output rows read only its
``R`` columns), so the update of every projection of the layer is two matmuls:
``y += (x @ a.T) @ b.T``. A smaller adapter rank leaves zero rows and columns, which add
nothing. The scale is already in ``b`` (:mod:`glowlm.lora.adapter`).

Per step the runner hands :class:`LoRAState` the slot of every token row (-1: the base
model); each layer then adds the update of each slot in use to its rows after its base
matmul, which runs once for all rows (:meth:`LoRAState.update`, through the platform's
``lora_shrink_expand`` op). A step without adapter rows costs one attribute test per
layer, and the fused decoder layer/stack ops (which run the dense projections
themselves) are used only in such steps.

Under tensor parallelism a column-parallel layer keeps all of A and its rows of B; a
row-parallel layer keeps its columns of A and all of B, so its update is a partial sum
that the layer's all-reduce adds up with the base matmul's (no communication of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from glowlm.errors import LoRAError
from glowlm.lora.weights import LoRAAdapter, LoRAPair

#: (slot, token rows or None for every row)
Groups = list[tuple[int, torch.Tensor | None]]


@dataclass
class LoRAMapping:
    """One step's rows: ``groups`` lists each slot in use with its rows (None: all)."""

    num_rows: int
    groups: Groups
    #: The slot of every row (-1: none), int64: what compiled ops read.
    slots: torch.Tensor | None = None


def group_rows(token_slots: Sequence[int]) -> LoRAMapping | None:
    """The mapping of rows to slots (-1: none); None when no row uses an adapter."""
    rows: dict[int, list[int]] = {}
    for i, s in enumerate(token_slots):
        if s >= 0:
            rows.setdefault(s, []).append(i)
    if not rows:
        return None
    n = len(token_slots)
    groups: Groups = [(s, None if len(r) == n else torch.tensor(r, dtype=torch.long))
                      for s, r in sorted(rows.items())]
    return LoRAMapping(n, groups, torch.tensor(list(token_slots), dtype=torch.int64))


class LoRAState:
    """The engine's LoRA settings and the current step's mapping, shared by every layer
    through :class:`glowlm.layers.context.ModelParts`."""

    def __init__(self, max_loras: int, max_rank: int, dtype: torch.dtype,
                 op: Callable[..., torch.Tensor] | None = None) -> None:
        from glowlm.ops import reference

        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.op = op or reference.lora_shrink_expand
        self._mapping: LoRAMapping | None = None
        self._pruned: LoRAMapping | None = None

    @property
    def active(self) -> bool:
        """Whether this step has rows on an adapter (the fused layer ops stand aside)."""
        return self._mapping is not None

    def begin_step(self, token_slots: Sequence[int] | None,
                   output_rows: Sequence[int] | None = None) -> None:
        """Set the step's mapping; ``output_rows``: the rows a model keeps past its last
        attention (``CausalLM.forward``'s ``output_rows``), whose MLP sees only those."""
        self._mapping = group_rows(token_slots) if token_slots else None
        self._pruned = None
        if self._mapping is not None and output_rows is not None and token_slots:
            self._pruned = group_rows([token_slots[r] for r in output_rows]) or LoRAMapping(
                len(output_rows), [])

    def end_step(self) -> None:
        self._mapping = self._pruned = None

    def update(self, slots: LoRASlots, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base matmul of ``x``) plus each row's adapter update."""
        m = self._mapping
        if m is None:
            return y
        n = x.numel() // x.shape[-1]
        if n != m.num_rows:
            m = self._pruned
            if m is None or n != m.num_rows:
                raise RuntimeError(f"LoRA: a layer got {n} rows but the step mapped "
                                   f"{self._mapping.num_rows if self._mapping else 0}")
        if not m.groups:
            return y
        shape = y.shape
        out = self.op(y.reshape(-1, shape[-1]), x.reshape(-1, x.shape[-1]), slots.a, slots.b,
                      m.groups, m.slots)
        return out.reshape(shape)


class LoRASlots(nn.Module):
    """One linear layer's adapter slots (see the module docstring)."""

    def __init__(self, layer: nn.Module, state: LoRAState) -> None:
        super().__init__()
        self.state = state
        self.num_slices = len(layer.output_sizes)
        self.in_features = int(layer.input_size)
        self.out_features = int(sum(layer.output_sizes))
        r, n = state.max_rank, state.max_loras
        # Buffers, not parameters: no weight loader touches them and the linear choice
        # does not see them as a layer's weight.
        self.register_buffer("a", torch.zeros(n, self.num_slices * r, self.in_features,
                                              dtype=state.dtype), persistent=False)
        self.register_buffer("b", torch.zeros(n, self.out_features, self.num_slices * r,
                                              dtype=state.dtype), persistent=False)

    def nbytes(self) -> int:
        return (self.a.numel() + self.b.numel()) * self.a.element_size()

    def clear(self, slot: int) -> None:
        self.a[slot].zero_()
        self.b[slot].zero_()

    def write(self, slot: int, layer: nn.Module, pieces: list[tuple[int, LoRAPair]]) -> None:
        """Put ``pieces`` ((projection index, pair), checkpoint-sized) in ``slot``, this
        rank's shard of each."""
        r = self.state.max_rank
        self.clear(slot)
        offsets = [sum(layer.output_sizes[:i]) for i in range(self.num_slices)]
        for index, pair in pieces:
            a, b = shard_pair(layer, index, pair)
            k = a.shape[0]
            self.a[slot, index * r:index * r + k].copy_(a)
            rows = layer.output_sizes[index]
            self.b[slot, offsets[index]:offsets[index] + rows, index * r:index * r + k].copy_(b)


def shard_pair(layer: nn.Module, index: int, pair: LoRAPair) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (A, B) of projection ``index`` of ``layer`` (the layer knows how it is
    split: :meth:`glowlm.layers.linear.LinearBase.lora_shard`)."""
    return layer.lora_shard(index, pair.a, pair.b)


def adapted_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The model's linear layers that hold slots, by prefix."""
    return {m.prefix: m for m in model.modules() if isinstance(getattr(m, "lora", None),
                                                                LoRASlots)}


def _checkpoint_rows(layer: nn.Module, index: int) -> int:
    sizes = layer.checkpoint_sizes() if hasattr(layer, "checkpoint_sizes") else [
        sum(layer.output_sizes)]
    return int(sizes[index])


def resolve(model: nn.Module, adapter: LoRAAdapter, max_rank: int,
            layers: dict[str, nn.Module] | None = None, partial: bool = False
            ) -> dict[str, list[tuple[int, LoRAPair]]]:
    """Each adapted layer's pieces: the adapter's checkpoint-named modules mapped onto the
    model's layers (fused ones by their shard ids) and checked against their shapes.

    ``partial``: skip modules whose layer this rank does not hold (a pipeline stage);
    otherwise such a module is an error naming it.
    """
    layers = adapted_layers(model) if layers is None else layers
    if adapter.rank > max_rank:
        raise LoRAError(f"LoRA adapter {adapter.path!r} has rank {adapter.rank}, above "
                        f"--max-lora-rank {max_rank}: restart with --max-lora-rank "
                        f">= {adapter.rank}")
    stacked = list(getattr(model, "stacked_params", []))
    out: dict[str, list[tuple[int, LoRAPair]]] = {}
    for module, pair in adapter.modules.items():
        name = model.rename(f"{module}.weight") if hasattr(model, "rename") else None
        if name is None:
            name = f"{module}.weight"
        shard: Any = None
        target = name
        for fused, part, sid in stacked:
            if f".{part}." in name:
                target, shard = name.replace(f".{part}.", f".{fused}."), sid
                break
        prefix = target.removesuffix(".weight")
        layer = layers.get(prefix)
        if layer is None:
            if partial and ".layers." in prefix:
                continue
            raise LoRAError(f"LoRA adapter {adapter.path!r} adapts {module!r}, which is not a "
                            "linear projection of this model's layers that glowlm adapts "
                            "(attention and MLP projections; not embeddings, the LM head or "
                            "mixture-of-experts experts)")
        if shard is None and len(layer.output_sizes) > 1:
            # A module the checkpoint stores fused (Phi-3's qkv_proj): one A, B split into
            # the projections.
            sizes = [_checkpoint_rows(layer, i) for i in range(len(layer.output_sizes))]
            if pair.b.shape[0] != sum(sizes):
                raise LoRAError(_shape_message(adapter, module, pair, sum(sizes),
                                               layer.full_input_size))
            pieces = [(i, LoRAPair(pair.a, b)) for i, b in
                      enumerate(pair.b.split(sizes, 0))]
        else:
            index = layer.shard_index(shard) if hasattr(layer, "shard_index") else 0
            pieces = [(index, pair)]
        for index, piece in pieces:
            rows = _checkpoint_rows(layer, index)
            if piece.b.shape[0] != rows or piece.a.shape[1] != layer.full_input_size:
                raise LoRAError(_shape_message(adapter, module, piece, rows, layer.full_input_size))
            out.setdefault(prefix, []).append((index, piece))
    return out


def _shape_message(adapter: LoRAAdapter, module: str, pair: LoRAPair, rows: int,
                   cols: int) -> str:
    return (f"LoRA adapter {adapter.path!r}: module {module!r} maps {pair.a.shape[1]} -> "
            f"{pair.b.shape[0]} features but this model's projection maps {cols} -> {rows}: "
            "the adapter was trained on a different base model")


def load_slot(layers: dict[str, nn.Module], slot: int,
              pieces: dict[str, list[tuple[int, LoRAPair]]] | None) -> None:
    """Write an adapter's resolved pieces into ``slot`` of every layer (None: clear it)."""
    for prefix, layer in layers.items():
        own = pieces.get(prefix) if pieces is not None else None
        if own:
            layer.lora.write(slot, layer, own)
        else:
            layer.lora.clear(slot)


def slot_bytes(layers: dict[str, nn.Module]) -> int:
    return sum(m.lora.nbytes() for m in layers.values())
