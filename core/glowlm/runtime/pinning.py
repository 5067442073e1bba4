"""Applying a rank's binding in this process: thread count, per-thread pinning, memory.

How each OpenMP thread gets its own CPU, from Python and without compiling
anything: we call the OpenMP runtime's ``GOMP_parallel`` entry point (what
``#pragma omp parallel`` compiles to; libgomp, libiomp5 and LLVM libomp all
export it) through ctypes, with a ctypes callback as the region body. Every thread
of the team runs the callback, asks ``omp_get_thread_num()`` and pins itself with
``sched_setaffinity(0, ...)``, which on Linux affects only the calling thread.
The runtime keeps those threads in its pool and reuses them, in the same order,
for torch's parallel regions started from the same thread, so the pinning holds.

Why not the alternatives: a C++ helper through ``torch.utils.cpp_extension`` needs
a compiler at start-up; ``OMP_PLACES``/``OMP_PROC_BIND`` are read only when the
runtime loads, i.e. before our settings exist (they would need a re-exec per rank);
pinning only the process leaves threads free to migrate within the set.

The calling (master) thread keeps the whole set rather than one CPU: threads it
creates later (tokenizers, the HTTP server) inherit its affinity and must not all
pile onto one core. Thread 0 of the team therefore floats over the rank's CPUs.
"""

from __future__ import annotations

import ctypes
import os
import threading

from glowlm.logger import init_logger

logger = init_logger(__name__)

# Preference when several are mapped: an LD_PRELOADed libiomp5 interposes libgomp.
OPENMP_RUNTIMES = ("libiomp5", "libgomp", "libomp")


def pin_openmp_threads(cpus: tuple[int, ...]) -> tuple[int, str]:
    """Pin OpenMP thread i (i >= 1) to ``cpus[i]``; return (threads pinned, how/why not)."""
    from glowlm.runtime.preload import mapped

    runtimes = mapped()
    name = next((n for n in OPENMP_RUNTIMES if n in runtimes), None)
    if name is None:
        return 0, "no OpenMP runtime mapped (torch without OpenMP?)"
    try:
        lib = ctypes.CDLL(runtimes[name])
        region, thread_num = lib.GOMP_parallel, lib.omp_get_thread_num
    except (OSError, AttributeError) as exc:
        return 0, f"{name} has no usable GOMP_parallel ({exc})"
    thread_num.restype = ctypes.c_int
    region.restype = None
    region.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    pinned: dict[int, int] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def body(_: object) -> None:
        i = thread_num()
        try:
            if 0 < i < len(cpus):
                os.sched_setaffinity(0, {cpus[i]})
                with lock:
                    pinned[i] = threading.get_native_id()
        except OSError as exc:
            with lock:
                errors.append(f"thread {i}: {exc}")

    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(body)
    region(ctypes.cast(callback, ctypes.c_void_p), None, len(cpus), 0)
    if errors:
        return len(pinned), f"pinning failed for {len(errors)} thread(s): {errors[0]}"
    return len(pinned), f"via {name}"


def apply(cpus: tuple[int, ...], node: int | None) -> list[str]:
    """Thread count, affinity and memory policy for this rank; what happened, as notes.

    Only failures the kernel reports are tolerated (they become notes and a
    warning); the plan itself was validated before.
    """
    if not cpus:
        return ["not applied: nobind"]
    import torch

    notes: list[str] = []
    if node is not None:
        # First: memory policy is per thread, and OpenMP workers created by the region
        # below inherit it. Workers that already exist keep the default (local) policy,
        # which on CPUs of this node means this node too.
        from glowlm.runtime import numa

        notes.append(numa.bind_memory(node).detail)
    os.sched_setaffinity(0, set(cpus))
    torch.set_num_threads(len(cpus))
    count, how = pin_openmp_threads(cpus)
    if count == len(cpus) - 1:
        notes.append(f"{count + 1} OpenMP threads pinned one per CPU {how}")
    else:
        logger.warning("per-thread pinning incomplete (%s); threads stay within CPUs %s",
                       how, ",".join(map(str, cpus)))
        notes.append(f"process pinned to the CPU set; per-thread pinning: {how}")
    return notes
