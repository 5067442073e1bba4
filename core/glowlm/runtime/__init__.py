"""The CPU runtime: topology, thread binding, NUMA, memory planning, allocator/OpenMP."""
