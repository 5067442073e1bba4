"""Tensor/pipeline-parallel state. World size 1 today; layers already take shards."""

from glowlm.distributed.parallel import ParallelState, single_process

__all__ = ["ParallelState", "single_process"]
