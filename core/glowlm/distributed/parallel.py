"""The parallel layout one rank sees, and the collectives layers call.

Layers receive a :class:`ParallelState` explicitly, so a tensor-parallel rank
builds its shard of each weight and calls the collectives here; with a world
size of 1 they are identities and cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ParallelState:
    tp_rank: int = 0
    tp_size: int = 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum partial results of a row-parallel layer across TP ranks."""
        if self.tp_size == 1:
            return x
        torch.distributed.all_reduce(x)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate column-parallel shards (e.g. vocab logits) across TP ranks."""
        if self.tp_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        torch.distributed.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def single_process() -> ParallelState:
    return ParallelState()


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        from glowlm.errors import ConfigError

        raise ConfigError(f"{what} ({numerator}) is not divisible by the tensor-parallel size "
                          f"({denominator})")
    return numerator // denominator
