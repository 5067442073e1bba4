"""Rank processes for tensor and pipeline parallelism on one host.

The driver (rank 0) lives in the engine's process: it schedules, builds each
step's inputs, broadcasts them and samples. Ranks 1..world-1 are processes
started with ``spawn`` (a fresh interpreter: OpenMP, the allocator and the NUMA
policy are set per rank before torch's thread pool exists, and no parent state
is copied by ``fork``). Each rank binds its OpenMP threads to its own CPU list
(``glowlm.runtime.binding``, one NUMA node per rank with ``auto``), plans its
memory, loads its shard and then loops on the step broadcast.

Start-up is a handshake over one pipe per rank so that a rank that fails
(memory plan, broken checkpoint) stops everybody with its own message before
weights are read elsewhere: every rank plans, reports "planned" and waits for
"load"; after loading each reports the KV blocks it can hold and all use the
smallest. Then ``torch.distributed`` (gloo) is initialised over TCP at
``MASTER_ADDR:MASTER_PORT`` and checks the group with one all-reduce; the
steps themselves go through the shared-memory groups of
:mod:`glowlm.distributed.shm`.

Failure: a monitor thread in the driver watches every rank's process sentinel.
When one exits unexpectedly it records one line ("rank 1 (pid N) was killed by
SIGKILL"), aborts the shared-memory groups (every wait raises RankFailure with
that line) and terminates the other ranks. Ranks die with the driver
(``PR_SET_PDEATHSIG``) and ignore Ctrl-C, which the driver handles.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from glowlm.distributed.parallel import ParallelState
from glowlm.distributed.shm import ShmGroup, create_segment, unlink_segment
from glowlm.errors import GlowlmError
from glowlm.logger import init_logger

logger = init_logger(__name__)

#: Seconds a rank may take from spawn to "planned" and from "load" to "loaded".
SETUP_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Layout:
    """Every shared-memory segment of a TP x PP group, by role (paths in /dev/shm)."""

    tp: int
    pp: int
    world_path: str
    tp_paths: tuple[str, ...]                          # one per pipeline stage
    pp_paths: dict[tuple[int, int], str] = field(default_factory=dict)  # per tp rank, stage pair

    @classmethod
    def create(cls, tp: int, pp: int) -> Layout:
        world = tp * pp
        tp_paths = tuple(create_segment(tp, f"tp{s}") if tp > 1 else "" for s in range(pp))
        pairs: dict[tuple[int, int], str] = {}
        for t in range(tp):
            for s in range(pp - 1):
                pairs[(t, s)] = create_segment(2, f"pp{t}-{s}")
            if pp > 2:
                pairs[(t, pp - 1)] = create_segment(2, f"pp{t}-ret")
        return cls(tp, pp, create_segment(world, "world"), tp_paths, pairs)

    def paths(self) -> list[str]:
        return [self.world_path, *[p for p in self.tp_paths if p], *self.pp_paths.values()]

    def unlink(self) -> None:
        for p in self.paths():
            unlink_segment(p)


class RankComms:
    """The groups one rank takes part in, mapped."""

    def __init__(self, layout: Layout, rank: int) -> None:
        tp, pp = layout.tp, layout.pp
        self.rank, self.tp_rank, self.pp_rank = rank, rank % tp, rank // tp
        self.world = ShmGroup(layout.world_path, tp * pp, rank, name="world")
        self.tp_group = (ShmGroup(layout.tp_paths[self.pp_rank], tp, self.tp_rank, name="tp")
                         if tp > 1 else None)
        #: stage pair key -> (group, my index in it); pair (t, s) links stage s and s+1,
        #: pair (t, pp-1) links the last stage back to stage 0 (pp > 2 only).
        self.pairs: dict[int, ShmGroup] = {}
        for (t, s), path in layout.pp_paths.items():
            if t != self.tp_rank:
                continue
            a, b = (s, s + 1) if s < pp - 1 else (0, pp - 1)
            if self.pp_rank in (a, b):
                other = b if self.pp_rank == a else a
                self.pairs[other] = ShmGroup(path, 2, 0 if self.pp_rank == a else 1,
                                             name=f"pp{a}-{b}")

    def groups(self) -> list[ShmGroup]:
        out = [self.world, *self.pairs.values()]
        return out + ([self.tp_group] if self.tp_group is not None else [])

    def peer(self, stage: int) -> tuple[ShmGroup, int, int]:
        """(group linking this rank to ``stage``'s rank of the same TP index, my index,
        its index)."""
        group = self.pairs[stage]
        return group, group.rank, 1 - group.rank

    def state(self, tp: int, pp: int) -> ParallelState:
        return ParallelState(self.tp_rank, tp, self.pp_rank, pp, self.tp_group)

    def abort(self, reason: str) -> None:
        for g in self.groups():
            g.dead_reason = reason
            g.abort()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exit_description(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == 9 or code == 137:
        return f"exited with code {code} (killed, often the kernel's out-of-memory killer)"
    return f"exited with code {code}"


def init_gloo(rank: int, world: int, addr: str, port: int) -> None:
    """Join the torch.distributed (gloo) group and check it with one all-reduce."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    check = torch.ones(1)
    dist.all_reduce(check)
    if int(check.item()) != world:
        raise GlowlmError(f"the gloo group is inconsistent ({int(check.item())} of {world})")


class Executor:
    """Starts ranks 1..world-1, runs the start-up handshake, broadcasts steps, stops them."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.tp, self.pp = config.tensor_parallel_size, config.pipeline_parallel_size
        self.world = self.tp * self.pp
        self.layout = Layout.create(self.tp, self.pp)
        self.addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.port = int(os.environ.get("MASTER_PORT") or _free_port())
        self._stopping = False
        self._in_loop = False
        self._failure: str | None = None
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        try:
            self.comms = RankComms(self.layout, 0)
            ctx = mp.get_context("spawn")
            from glowlm.distributed.worker import worker_main

            for rank in range(1, self.world):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=worker_main, name=f"glowlm-rank{rank}",
                                   args=(config, self.layout, rank, child, self.addr, self.port,
                                         os.getpid()),
                                   daemon=True)
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
        except BaseException:
            self.shutdown()
            raise
        self._monitor = threading.Thread(target=self._watch, name="glowlm-rank-monitor",
                                         daemon=True)
        self._monitor.start()
        atexit.register(self.shutdown)
        logger.info("started %d rank process(es) (TP %d x PP %d): pids %s", self.world - 1,
                    self.tp, self.pp, ", ".join(str(p.pid) for p in self.procs))

    # -- start-up handshake ---------------------------------------------------------------

    def link(self) -> DriverLink:
        return DriverLink(self)

    def _collect(self, kind: str) -> list[Any]:
        """One ``kind`` message from every rank; a rank's error or death stops all."""
        values: dict[int, Any] = {}
        deadline = time.monotonic() + SETUP_TIMEOUT
        while len(values) < len(self.conns):
            pending = [c for i, c in enumerate(self.conns) if i + 1 not in values]
            ready = mpc.wait(pending + [p.sentinel for i, p in enumerate(self.procs)
                                        if i + 1 not in values],
                             timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self.shutdown()
                raise GlowlmError(f"rank start-up timed out waiting for {kind!r}")
            for obj in ready:
                if obj in self.conns:
                    rank = self.conns.index(obj) + 1
                    try:
                        tag, value = obj.recv()
                    except EOFError:
                        continue  # its sentinel says why
                    if tag == "error":
                        self.shutdown()
                        raise GlowlmError(f"rank {rank}: {value}")
                    values[rank] = value
                else:
                    rank = [p.sentinel for p in self.procs].index(obj) + 1
                    if rank in values:
                        continue
                    proc = self.procs[rank - 1]
                    proc.join(0.5)
                    self.shutdown()
                    raise GlowlmError(f"rank {rank} (pid {proc.pid}) "
                                      f"{_exit_description(proc.exitcode)} during start-up")
        return [values[r] for r in range(1, self.world)]

    def _send_all(self, message: Any) -> None:
        for c in self.conns:
            c.send(message)

    def planned(self) -> None:
        """Driver planned its memory: wait for every rank's plan, then let all load."""
        self._collect("planned")
        # Every rank mapped its segments before planning: drop the names now, so even a
        # driver killed later (SIGKILL, SIGTERM) leaves nothing in /dev/shm.
        self.layout.unlink()
        self._send_all(("load", None))

    def agree_blocks(self, local: int) -> int:
        """Every rank's KV block count after loading; all use the smallest."""
        blocks = min([local, *self._collect("loaded")])
        self._send_all(("blocks", blocks))
        init_gloo(0, self.world, self.addr, self.port)
        self._collect("gloo")
        return blocks

    # -- steps ----------------------------------------------------------------------------

    def broadcast(self, payload: Any) -> None:
        """Send a step (or None: stop) to every rank through shared memory."""
        self.comms.world.broadcast_bytes(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))

    # -- failure and shutdown ---------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        return self._failure

    def _watch(self) -> None:
        sentinels = {p.sentinel: (i + 1, p) for i, p in enumerate(self.procs)}
        while sentinels and not self._stopping:
            ready = mpc.wait(list(sentinels), timeout=0.5)
            for s in ready:
                rank, proc = sentinels.pop(s)
                if self._stopping:
                    return
                proc.join(0.1)
                line = (f"rank {rank} (pid {proc.pid}) {_exit_description(proc.exitcode)}; "
                        f"stopped all {self.world} ranks")
                self._failure = line
                if self._in_loop:  # during start-up _collect says it
                    logger.error("%s", line)
                self.comms.abort(line)
                self._terminate()
                return

    def _terminate(self) -> None:
        for p in self.procs:
            if p.is_alive():
                with contextlib.suppress(Exception):
                    p.terminate()
        deadline = time.monotonic() + 3.0
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                with contextlib.suppress(Exception):
                    p.kill()
                p.join(1.0)

    def shutdown(self) -> None:
        """Stop every rank (a clean stop message when they are in the step loop)."""
        if self._stopping:
            return
        self._stopping = True
        comms = getattr(self, "comms", None)
        if comms is not None and self._failure is None and all(p.is_alive() for p in self.procs):
            with contextlib.suppress(Exception):
                # Only reaches ranks already in their step loop; others get SIGTERM below.
                if self._in_loop:
                    self.broadcast(None)
                    deadline = time.monotonic() + 5.0
                    for p in self.procs:
                        p.join(max(0.0, deadline - time.monotonic()))
        if comms is not None:
            comms.abort("the engine is shutting down")
        self._terminate()
        self.layout.unlink()
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def started_loop(self) -> None:
        self._in_loop = True


class DriverLink:
    """Rank 0's side of the start-up handshake (glowlm.engine.setup calls it)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.rank = 0
        self.parallel = executor.comms.state(executor.tp, executor.pp)

    def planned(self) -> None:
        self.executor.planned()

    def agree_blocks(self, local: int) -> int:
        return self.executor.agree_blocks(local)

