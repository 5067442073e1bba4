"""The CPU runtime: topology, thread binding, NUMA, huge pages, allocator/OpenMP preload.

Host facts and process placement, below everything that builds a model; the memory
plan for a model (weights, KV cache, per rank) is the engine's (:mod:`glowlm.engine.memory`).
"""
