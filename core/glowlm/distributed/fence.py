"""The memory fence the shared-memory collectives' Python path needs on this CPU.

A collective (:mod:`glowlm.distributed.shm`) writes a rank's slot, then its stamp; a peer
that sees the stamp reads the slot. That is correct only if the slot's stores are
visible before the stamp's, and the peer's slot loads are not satisfied before its
stamp load, and (for reuse of a buffer) a reader's last slot loads complete before it
publishes that it is done.

- **x86-64 and s390x** give all three for free: x86 is TSO (stores are seen in program
  order, loads are not reordered with loads, nor stores with earlier loads), and
  z/Architecture is stronger still. Python adds no reordering of its own: every store
  and load here is a call into numpy or torch C code, opaque to the compiler. No fence.
- **aarch64, ppc64le, riscv64** (weakly ordered) give none of them: a writer's data can
  become visible after its stamp, a reader can read stale slot bytes after seeing a
  fresh stamp. Each publish needs a fence before its stamp store and each completed
  wait one before its slot loads. Python has no fence instruction, so it calls one
  compiled fence, from a system library (~0.3 us per call through ctypes):

  - Linux: ``atomic_thread_fence`` of GCC's libatomic (``libatomic.so.1``, the C11
    out-of-line fence; on aarch64 its body is ``dmb ish``, a full barrier; Debian's
    ``libatomic1``, present wherever g++ is, which the plugins' kernels need anyway).
  - macOS: ``OSMemoryBarrier()`` from libSystem (a ``dmb ish`` on Apple silicon).

  Where neither exists the group refuses to start with one line naming the package,
  rather than rely on luck.

The compiled all-reduce of the kernel tree (``csrc/cpu/shm_reduce.h``) needs none of
this: its stamp is a release store and its waits acquire loads, which the compiler
turns into the right instructions on each ISA (``stlr``/``ldar`` on aarch64). The Arm
and IBM Z plugins hand it to the engine (``OpsTable.shm_all_reduce``), so on a TP rank
only the collectives without a compiled form (all-gather, broadcast, barrier) pay the
fence calls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
from collections.abc import Callable

#: CPUs whose memory model orders the protocol's stores and loads without a fence.
STRONGLY_ORDERED = frozenset({"x86_64", "amd64", "i386", "i686", "s390x"})
_SEQ_CST = 5  # memory_order_seq_cst (GCC's __ATOMIC_SEQ_CST)
Fence = Callable[[], None]


class FenceUnavailable(RuntimeError):
    """This host offers no way to order memory from Python (the message says why)."""


def needs_fence(machine: str | None = None) -> bool:
    """Whether the protocol needs a fence on ``machine`` (default: this one)."""
    return (machine or platform.machine()).lower() not in STRONGLY_ORDERED


def libatomic_fence() -> Fence:
    """``atomic_thread_fence(memory_order_seq_cst)`` from GCC's libatomic (a full barrier:
    ``dmb ish`` on aarch64, ``lock or`` on x86-64); :class:`FenceUnavailable` if absent."""
    name = ctypes.util.find_library("atomic") or "libatomic.so.1"
    try:
        fn = ctypes.CDLL(name).atomic_thread_fence
    except (OSError, AttributeError) as exc:
        raise FenceUnavailable(
            f"the shared-memory collectives need a memory fence on {platform.machine()} and "
            f"take it from libatomic, which did not load ({exc}); install it (apt-get "
            "install libatomic1, dnf install libatomic)"
        ) from None
    fn.argtypes = [ctypes.c_int]
    fn.restype = None
    return functools.partial(fn, _SEQ_CST)


def darwin_fence() -> Fence:
    """``OSMemoryBarrier`` from libSystem (macOS); :class:`FenceUnavailable` if absent."""
    try:
        fn = ctypes.CDLL("/usr/lib/libSystem.B.dylib").OSMemoryBarrier
    except (OSError, AttributeError) as exc:
        raise FenceUnavailable(f"libSystem has no OSMemoryBarrier ({exc})") from None
    fn.argtypes = []
    fn.restype = None
    return fn  # type: ignore[no-any-return]


def host_fence(machine: str | None = None, system: str | None = None) -> Fence | None:
    """The fence this host's collectives need: ``None`` where the CPU orders the protocol
    by itself, else the system's fence; :class:`FenceUnavailable` if it has none."""
    machine = machine or platform.machine()
    system = system or platform.system()
    if not needs_fence(machine):
        return None
    if system == "Linux":
        return libatomic_fence()
    if system == "Darwin":
        return darwin_fence()
    raise FenceUnavailable(f"no memory fence reachable from Python on {system} {machine}")
