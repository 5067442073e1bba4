"""The processes behind one engine or several: TP/PP ranks, other hosts, DP replicas.

The engine (:mod:`glowlm.engine`) is rank 0 of its group; this floor starts the
rest (:func:`start_ranks`, which ``LLMEngine`` takes as ``ranks``):

- :mod:`.executor` — the driver's handle on its group (:class:`~.executor.Executor`),
  :mod:`.procs` — this host's rank processes, :mod:`.worker` — what each rank runs;
- :mod:`.hosts` — the TCP link between hosts, :mod:`.join` — hosts joining node 0,
  :mod:`.node` — a ``--headless`` host's side;
- :mod:`.layout` — refusing a TP/PP layout the model cannot take, before any rank
  starts;
- :mod:`.dp` — data-parallel engines, one process per replica.

The parallel state and collectives the layers read sit below the layers, in
:mod:`glowlm.distributed`; this package sits above the engine (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glowlm.config import EngineConfig
    from glowlm.executor.executor import Executor


def start_ranks(config: EngineConfig) -> Executor:
    """Check the layout fits the model, then start the other ranks of ``config``'s group
    (``LLMEngine``'s ``ranks``)."""
    from glowlm.executor.executor import Executor
    from glowlm.executor.layout import check_layout

    check_layout(config)  # before any rank process starts
    return Executor(config)


__all__ = ["start_ranks"]
