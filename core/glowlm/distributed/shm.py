"""Shared-memory collectives for ranks on one host: all-reduce, all-gather, broadcast.

Why not gloo: on loopback one gloo all-reduce of a decode step's hidden state
costs hundreds of microseconds (TCP, a thread hand-off), and a TP decode step
does two per layer. Here every rank of a group maps one file in ``/dev/shm``;
a collective is "write my part into my slot, publish a stamp, wait for the
stamps I need, read". A torch copy and an add on 8 KiB plus a handful of
Python statements: ~10 us for 2,048 fp32 values between two ranks
(``glowlm bench allreduce``).

Layout of a group's segment: a control block of int64 (``abort`` flag at 0,
one stamp per rank after it), then two buffers of one slot per rank. Op number
``seq`` uses buffer ``seq % 2``. Before a rank overwrites its slot in buffer
``seq % 2`` it waits until every rank has published stamp ``seq - 1``: a rank
publishes ``seq - 1`` only after it has finished reading op ``seq - 2``, the
last op that used that buffer. So two buffers suffice and nobody waits for a
reader except one op behind. On x86 and s390x stores are seen in program order,
so the data written before a stamp is visible once the stamp is; on weakly ordered
CPUs (aarch64, ppc64le) every publish calls a compiled full fence before its stamp
and every completed wait one before its reads (:mod:`glowlm.distributed.fence`).

Waiting spins (a numpy load per iteration) for up to :data:`SPIN_SECONDS` (none
when the process may use fewer CPUs than there are ranks: its affinity mask on
Linux, ``os.cpu_count()`` on macOS, which has no affinity API; a spinner would hold
the CPU its peer needs, and ``sched_yield`` on a busy machine gives away a whole time
slice), then sleeps in ``futex(FUTEX_WAIT)`` on the awaited rank's 32-bit wake word, which
every publish bumps before ``FUTEX_WAKE`` (one syscall, ~1 us). Balanced TP
ranks meet within the spin; an idle server's ranks sleep in the kernel and cost
nothing. Sleeps time out every 100 ms to look at the ``abort`` flag, which the
driver sets when any rank dies: every wait then raises :class:`RankFailure`. Where
the kernel has no futex (macOS), a wait past the spin sleeps 100 us at a time.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from glowlm.distributed.fence import Fence, FenceUnavailable, host_fence
from glowlm.errors import GlowlmError
from glowlm.runtime.topology import usable_cpu_count

#: Bytes per rank per buffer; larger tensors go through in chunks of this size.
SLOT_BYTES = 4 << 20
_CONTROL_BYTES = 4096
_WORDS_OFFSET = 2048  # int32 futex words, one per rank
_CHECK_EVERY = 64
SPIN_SECONDS = 0.0002
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
#: Linux's futex system call number on this CPU (None elsewhere: macOS has no futex).
_SYS_FUTEX = ({"x86_64": 202, "aarch64": 98, "s390x": 238, "ppc64le": 221}.get(
    platform.machine()) if platform.system() == "Linux" else None)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_LIBC = ctypes.CDLL(None, use_errno=True)
_SLEEP = _Timespec(0, 100_000_000)


class RankFailure(GlowlmError):
    """Another rank of the group died or the group was stopped; the step cannot finish."""


def segment_bytes(world: int, slot_bytes: int = SLOT_BYTES) -> int:
    return _CONTROL_BYTES + 2 * world * slot_bytes


def create_segment(world: int, tag: str, slot_bytes: int = SLOT_BYTES) -> str:
    """Create a zeroed segment file and return its path (the creator unlinks it later)."""
    if 8 * (world + 1) > _WORDS_OFFSET:
        raise GlowlmError(f"a shared-memory group holds at most {_WORDS_OFFSET // 8 - 1} ranks")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    path = os.path.join(base, f"glowlm-{os.getpid()}-{tag}-{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, segment_bytes(world, slot_bytes))
    finally:
        os.close(fd)
    return path


def unlink_segment(path: str) -> None:
    """Remove the name; ranks that mapped it keep their mapping until they exit."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class ShmGroup:
    """The collectives of ``world`` ranks that mapped the same segment; this is ``rank``.

    Every rank of the group must issue the same ops in the same order (as with
    any collective library); the op counter is per process. ``fence``: the memory
    fence around stamps (default: the one this CPU needs, none on x86 and s390x;
    tests pass one to run the weakly ordered path on any CPU).
    """

    def __init__(self, path: str, world: int, rank: int, slot_bytes: int = SLOT_BYTES,
                 name: str = "group", spin_seconds: float | None = None,
                 fence: Fence | None | str = "host") -> None:
        self.path, self.world, self.rank, self.name = path, world, rank, name
        if fence == "host":
            try:
                fence = host_fence()
            except FenceUnavailable as exc:
                raise GlowlmError(str(exc)) from None
        self._fence: Fence | None = fence  # type: ignore[assignment]
        if spin_seconds is None:
            spin_seconds = SPIN_SECONDS if usable_cpu_count() >= world else 0.0
        self.spin_seconds = spin_seconds
        self.slot_bytes = slot_bytes
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, segment_bytes(world, slot_bytes))
        finally:
            os.close(fd)
        self._control = np.frombuffer(self._map, dtype=np.int64, count=world + 1)
        self._words = np.frombuffer(self._map, dtype=np.int32, count=world,
                                    offset=_WORDS_OFFSET)
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        raw = torch.frombuffer(self._map, dtype=torch.uint8, offset=_CONTROL_BYTES,
                               count=2 * world * slot_bytes)
        self._slots = [[raw[(b * world + r) * slot_bytes:(b * world + r + 1) * slot_bytes]
                        for r in range(world)] for b in range(2)]
        # The op counter lives in a tensor that compiled code can advance too (see
        # native_state): [segment address, world, rank, slot bytes, spin ns, counter].
        self._state = torch.tensor([self._base, world, rank, slot_bytes,
                                    int(spin_seconds * 1e9), 0], dtype=torch.int64)
        self._counter = self._state.numpy()
        self.dead_reason = "another rank stopped"
        #: The platform's compiled all-reduce (``OpsTable.shm_all_reduce``), if any.
        self._compiled: Callable[[torch.Tensor, torch.Tensor], Any] | None = None

    def use_compiled_all_reduce(self, fn: Callable[[torch.Tensor, torch.Tensor], Any] | None
                                ) -> None:
        """Run :meth:`all_reduce` through ``fn(x, native_state())`` from now on.

        Why: the Python path costs tens of microseconds of interpreter and torch
        dispatch per call, and a TP decode step makes two all-reduces per layer; the
        compiled one follows the same protocol on the same segment and counter, so
        the group may switch at any op (every rank still issues the same ops).
        """
        self._compiled = fn

    def native_state(self) -> torch.Tensor:
        """This group as compiled code sees it: int64 ``[segment address, world, rank,
        slot bytes, spin ns, op counter]``.

        A platform's fused decoder stack passes it to its kernels, which run the same
        all-reduce protocol on the same segment and advance the same counter in place,
        so a rank may mix compiled and Python collectives in any order (every rank of
        the group still issues the same ops in the same order). The tensor lives as
        long as the group; the mapping must too.
        """
        return self._state

    # -- synchronisation ----------------------------------------------------------------

    def abort(self) -> None:
        """Make every current and future wait of every rank raise RankFailure."""
        self._control[0] = 1

    @property
    def aborted(self) -> bool:
        return bool(self._control[0])

    def _wait(self, ranks: Sequence[int], seq: int) -> None:
        control = self._control
        pending = [r + 1 for r in ranks if r != self.rank]
        spins = 0
        start = 0.0
        while pending:
            pending = [i for i in pending if control[i] < seq]
            if not pending:
                if self._fence is not None:  # no slot read may pass the stamps just seen
                    self._fence()
                return
            if control[0]:
                raise RankFailure(self.dead_reason)
            spins += 1
            if spins % _CHECK_EVERY == 0 or not self.spin_seconds:
                now = time.perf_counter()
                if start == 0.0:
                    start = now
                if now - start >= self.spin_seconds:
                    if _SYS_FUTEX is not None:
                        self._sleep(pending[0] - 1, seq)
                    else:
                        time.sleep(0.0001)

    def _sleep(self, rank: int, seq: int) -> None:
        """Block in the kernel until ``rank`` publishes (or 100 ms pass)."""
        word = int(self._words[rank])
        if self._control[rank + 1] >= seq:  # published after we looked: the word moved
            return
        _LIBC.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + _WORDS_OFFSET + 4 * rank),
                      _FUTEX_WAIT, ctypes.c_int(word), ctypes.byref(_SLEEP), None, 0)

    def _begin(self) -> tuple[int, list[torch.Tensor]]:
        """Next op: wait until my slot in its buffer is free; return (seq, buffer's slots)."""
        self._counter[5] += 1
        seq = int(self._counter[5])
        if seq > 2:
            self._wait(range(self.world), seq - 1)
        return seq, self._slots[seq % 2]

    def _publish(self, seq: int) -> None:
        if self._fence is not None:  # the slot (and the reads before) ahead of the stamp
            self._fence()
        self._control[self.rank + 1] = seq
        self._words[self.rank] = seq & 0x7FFFFFFF  # after the stamp: a sleeper's compare fails
        if _SYS_FUTEX is not None:
            _LIBC.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + _WORDS_OFFSET
                                                      + 4 * self.rank),
                          _FUTEX_WAKE, ctypes.c_int(0x7FFFFFFF), None, None, 0)

    # -- collectives --------------------------------------------------------------------

    def barrier(self) -> None:
        seq, _ = self._begin()
        self._publish(seq)
        self._wait(range(self.world), seq)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group in place; every rank gets bit-identical values.

        Ranks add the parts in rank order, in float32 for half types, so the
        result does not depend on which rank computes it.
        """
        if (self._compiled is not None and x.is_contiguous()
                and x.dtype in (torch.float32, torch.bfloat16, torch.float16)):
            try:
                self._compiled(x, self._state)
            except RuntimeError:
                if self.aborted:
                    raise RankFailure(self.dead_reason) from None
                raise
            return x
        flat = x.view(-1) if x.is_contiguous() else x.contiguous().view(-1)
        per = self.slot_bytes // flat.element_size()
        for start in range(0, flat.numel(), per):
            chunk = flat[start:start + per]
            n = chunk.numel()
            seq, slots = self._begin()
            nbytes = n * chunk.element_size()
            slots[self.rank][:nbytes].view(chunk.dtype).copy_(chunk)
            self._publish(seq)
            self._wait(range(self.world), seq)
            parts = [s[:nbytes].view(chunk.dtype) for s in slots]
            if chunk.dtype in (torch.bfloat16, torch.float16):
                acc = parts[0].float()
                for p in parts[1:]:
                    acc.add_(p)
                chunk.copy_(acc)
            elif self.world == 2:
                torch.add(parts[0], parts[1], out=chunk)
            else:
                chunk.copy_(parts[0])
                for p in parts[1:]:
                    chunk.add_(p)
        if flat.data_ptr() != x.data_ptr():
            x.copy_(flat.view_as(x))
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``x`` (same shape and dtype on all ranks), in rank order."""
        flat = x.contiguous().view(-1)
        outs = [torch.empty_like(flat) for _ in range(self.world)]
        per = self.slot_bytes // max(1, flat.element_size())
        for start in range(0, max(1, flat.numel()), per):
            chunk = flat[start:start + per]
            nbytes = chunk.numel() * chunk.element_size()
            seq, slots = self._begin()
            slots[self.rank][:nbytes].view(chunk.dtype).copy_(chunk)
            self._publish(seq)
            self._wait(range(self.world), seq)
            for r in range(self.world):
                outs[r][start:start + chunk.numel()].copy_(slots[r][:nbytes].view(chunk.dtype))
        return [o.view_as(x) for o in outs]

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """``root``'s bytes on every rank (others pass None); chunked when large."""
        header = 8
        room = self.slot_bytes - header
        if self.rank == root:
            assert data is not None
            total = len(data)
            offset = 0
            first = True
            while first or offset < total:
                first = False
                seq, slots = self._begin()
                piece = data[offset:offset + room]
                slot = slots[root]
                slot[:header].view(torch.int64)[0] = total
                if piece:
                    slot[header:header + len(piece)].copy_(
                        torch.frombuffer(bytearray(piece), dtype=torch.uint8))
                self._publish(seq)
                offset += len(piece)
            return data
        out = bytearray()
        total = -1
        while total < 0 or len(out) < total:
            seq, slots = self._begin()
            self._publish(seq)
            self._wait([root], seq)
            slot = slots[root]
            total = int(slot[:header].view(torch.int64)[0])
            take = min(room, total - len(out))
            if take:
                out += slot[header:header + take].numpy().tobytes()
        return bytes(out)

    def send_tensors(self, tensors: Sequence[torch.Tensor], root: int) -> None:
        """Broadcast tensors whose shapes and dtypes the receivers already know."""
        for t in tensors:
            self._broadcast_tensor(t, root)

    def recv_tensors(self, like: Sequence[tuple[tuple[int, ...], torch.dtype]], root: int
                     ) -> list[torch.Tensor]:
        outs = []
        for shape, dtype in like:
            t = torch.empty(shape, dtype=dtype)
            self._broadcast_tensor(t, root)
            outs.append(t)
        return outs

    def _broadcast_tensor(self, t: torch.Tensor, root: int) -> None:
        flat = t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)
        per = self.slot_bytes // max(1, flat.element_size())
        for start in range(0, max(1, flat.numel()), per):
            chunk = flat[start:start + per]
            nbytes = chunk.numel() * chunk.element_size()
            seq, slots = self._begin()
            if self.rank == root:
                slots[root][:nbytes].view(chunk.dtype).copy_(chunk)
                self._publish(seq)
            else:
                self._publish(seq)
                self._wait([root], seq)
                chunk.copy_(slots[root][:nbytes].view(chunk.dtype))
        if self.rank != root and flat.data_ptr() != t.data_ptr():
            t.copy_(flat.view_as(t))
