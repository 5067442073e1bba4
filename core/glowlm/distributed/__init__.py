"""The parallel state layers are built with and the collectives they call.

:class:`ParallelState` (which TP/PP shard this rank holds), shared-memory and gloo
collectives, and the groups of one engine's ranks. It sits below the layers; the rank
processes themselves are :mod:`glowlm.executor`'s (docs/architecture.md).
"""

from glowlm.distributed.parallel import ParallelState, single_process, stage_layers

__all__ = ["ParallelState", "single_process", "stage_layers"]
