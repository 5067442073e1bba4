"""What the engine needs of the other ranks of a TP/PP group, as an interface.

The engine (rank 0, the driver) schedules and samples; the other ranks are processes
that :mod:`glowlm.executor` starts, watches and stops. The engine only talks to them
through the :class:`Ranks` below, which the caller hands in
(``LLMEngine(config, ranks=glowlm.executor.start_ranks)``), so the engine floor does not import the
floor above it that spawns processes (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from glowlm.config import EngineConfig


class Ranks(Protocol):
    """The driver's handle on the group's other ranks."""

    #: The collectives' groups (:class:`glowlm.distributed.groups.RankComms`).
    comms: Any

    @property
    def failure(self) -> str | None:
        """The one line that ended the group (a rank or a host gone), else ``None``."""

    def link(self) -> Any:
        """This rank's side of the start-up handshake, for ``build_engine_parts``."""

    def broadcast(self, payload: Any) -> None:
        """Send one step's inputs to every other rank."""

    def started_loop(self) -> None:
        """Every rank is built; the step loop begins."""

    def shutdown(self) -> None:
        """Stop every other rank; idempotent."""


#: Starts the other ranks for ``config`` (after checking the layout fits the model).
StartRanks = Callable[[EngineConfig], Ranks]
