"""The parallel layout one rank sees, and the collectives layers call.

Layers receive a :class:`ParallelState` explicitly, so a tensor-parallel rank
builds its shard of each weight and calls the collectives here; with a world
size of 1 they are identities and cost nothing.

Rank numbering (as in vLLM): ``rank = pp_rank * tp_size + tp_rank``, so the TP
group of a pipeline stage is a run of consecutive ranks, and rank 0 (the driver,
which schedules and samples) is TP rank 0 of the first stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class ParallelState:
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    #: The TP group's communicator (ShmGroup); None with tp_size 1.
    tp_group: Any = field(default=None, compare=False, repr=False)

    @property
    def rank(self) -> int:
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum partial results of a row-parallel layer across TP ranks."""
        if self.tp_size == 1:
            return x
        return self.tp_group.all_reduce(x)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate column-parallel shards (e.g. vocab logits) across TP ranks."""
        if self.tp_size == 1:
            return x
        return torch.cat(self.tp_group.all_gather(x.contiguous()), dim=-1)


def single_process() -> ParallelState:
    return ParallelState()


def stage_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The decoder layers pipeline stage ``pp_rank`` runs: near-equal contiguous runs,
    the last stages taking the remainder (stage 0 also embeds and computes logits)."""
    base, extra = divmod(num_layers, pp_size)
    sizes = [base + (1 if r >= pp_size - extra else 0) for r in range(pp_size)]
    start = sum(sizes[:pp_rank])
    return range(start, start + sizes[pp_rank])


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        from glowlm.errors import ConfigError

        raise ConfigError(f"{what} ({numerator}) is not divisible by the tensor-parallel size "
                          f"({denominator})")
    return numerator // denominator


class PPMissingLayer(torch.nn.Module):
    """Stands in for a decoder layer another pipeline stage runs: no parameters (its
    checkpoint tensors are skipped when loading), never called."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this decoder layer runs on another pipeline stage")


def own_layers(make: Any, num_layers: int, parallel: ParallelState) -> torch.nn.ModuleList:
    """``make(i)`` for the layers of this pipeline stage, :class:`PPMissingLayer` elsewhere
    (indices, parameter names and KV cache slots stay global)."""
    if parallel.pp_size > num_layers:
        from glowlm.errors import ConfigError

        raise ConfigError(f"--pipeline-parallel-size {parallel.pp_size} exceeds the model's "
                          f"{num_layers} layers")
    stage = stage_layers(num_layers, parallel.pp_rank, parallel.pp_size)
    return torch.nn.ModuleList(make(i) if i in stage else PPMissingLayer()
                               for i in range(num_layers))
