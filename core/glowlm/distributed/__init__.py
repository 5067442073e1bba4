"""Tensor/pipeline-parallel state, shared-memory collectives and the rank processes."""

from glowlm.distributed.parallel import ParallelState, single_process, stage_layers

__all__ = ["ParallelState", "single_process", "stage_layers"]
