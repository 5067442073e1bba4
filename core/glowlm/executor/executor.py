"""Rank processes for tensor and pipeline parallelism, on one host or several.

The driver (rank 0) lives in the engine's process: it schedules, builds each
step's inputs, broadcasts them and samples. The other ranks of its host are
processes started with ``spawn`` (a fresh interpreter: OpenMP, the allocator and
the NUMA policy are set per rank before torch's thread pool exists, and no
parent state is copied by ``fork``). Each rank binds its OpenMP threads to its
own CPU list (``glowlm.runtime.binding``, one NUMA node per rank with ``auto``),
plans its memory, loads its shard and then loops on the step broadcast.

Several hosts (``--nnodes N``, one command per host): node 0 runs the driver and
ranks 0..L-1 (L = world / N); node n runs a headless command
(:mod:`glowlm.executor.node`) that connects to the driver at
``--master-addr:--master-port`` (the link: :mod:`glowlm.executor.hosts`) and
starts ranks n*L .. n*L+L-1. To the driver a remote node is one more peer of the
start-up handshake, and each step's inputs go to it over that connection; the
node relays them to its ranks through its own shared memory. Groups whose ranks
are all on one host use shared memory there; groups that span hosts use gloo
(:mod:`glowlm.distributed.gloo`).

Start-up is a handshake (a pipe per local rank, a TCP connection per remote node)
so that a rank that fails (memory plan, broken checkpoint) stops everybody with
its own message before weights are read elsewhere: every rank plans, reports
"planned" and waits for "load"; after loading each reports the KV blocks it can
hold and all use the smallest. Then ``torch.distributed`` (gloo) is initialised
over TCP and checked with one all-reduce (port ``MASTER_PORT`` on one host,
``--master-port`` + 1 with several).

Failure: a monitor thread in the driver watches every local rank's process
sentinel and every remote node's connection. When one ends unexpectedly it
records one line ("rank 1 (pid N) was killed by SIGKILL", "node 1 (...) went
away"), aborts the shared-memory groups (every wait raises RankFailure with that
line), terminates the local ranks and tells the other nodes to stop. Ranks die
with the process that started them (``PR_SET_PDEATHSIG``) and ignore Ctrl-C,
which the driver handles.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.connection as mpc
import os
import pickle
import socket
import threading
import time
from typing import Any

from glowlm.distributed.gloo import init_gloo
from glowlm.distributed.groups import Layout, RankComms
from glowlm.distributed.shm import RankFailure
from glowlm.errors import GlowlmError
from glowlm.executor import hosts, join
from glowlm.executor.procs import Peer, collect, recv, span, spawn_ranks, terminate
from glowlm.logger import init_logger

logger = init_logger(__name__)

__all__ = ["Executor", "Layout", "RankComms", "init_gloo"]

class Executor:
    """Starts this host's ranks 1..L-1, lets the other hosts join, runs the start-up
    handshake, broadcasts steps, stops everybody."""

    def __init__(self, config: Any) -> None:
        if config.node_rank > 0:
            from glowlm.errors import ConfigError

            raise ConfigError(f"--node-rank {config.node_rank} runs no engine: start that "
                              "host with 'glowlm serve MODEL ... --node-rank "
                              f"{config.node_rank} --headless' (node 0 runs the driver)")
        self.config = config
        self.tp, self.pp = config.tensor_parallel_size, config.pipeline_parallel_size
        self.world = self.tp * self.pp
        self.nnodes = config.nnodes
        self._stopping = False
        self._in_loop = False
        self._failure: str | None = None
        self._lock = threading.Lock()
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.local: list[Peer] = []
        self.nodes: list[Peer] = []
        self._listener: socket.socket | None = None
        self.layout = Layout.create(self.tp, self.pp, self.nnodes, 0)
        if self.nnodes > 1:
            self.addr, control = hosts.master_address(config)
            self.port = control + 1
        else:
            self.addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
            self.port = int(os.environ.get("MASTER_PORT") or hosts.free_port())
        try:
            self.comms = RankComms(self.layout, 0)
            if self.nnodes > 1:  # listen before the ranks start: a busy port fails at once
                self._listener = hosts.listen(self.addr, control)
            self.local = spawn_ranks(config, self.layout, range(1, self.layout.local_world),
                                     self.addr, self.port)
            self.procs = [p.proc for p in self.local]
            self.conns = [p.conn for p in self.local]
            if self.nnodes > 1:
                self.nodes = [Peer(f"node {n}", conn, None, n, where) for n, conn, where
                              in join.accept_nodes(self._listener, config, self.local,
                                                    self.addr, control)]
                self._listener.close()  # complete: a late extra host is refused, not held
                self._listener = None
        except BaseException:
            self.shutdown()
            raise
        self._monitor = threading.Thread(target=self._watch, name="glowlm-rank-monitor",
                                         daemon=True)
        self._monitor.start()
        atexit.register(self.shutdown)
        pids = ", ".join(str(p.pid) for p in self.procs) or "none"
        if self.nnodes > 1:
            logger.info("TP %d x PP %d on %d hosts: %s on this host (rank 0 is the driver%s)",
                        self.tp, self.pp, self.nnodes, span(self.layout.host_ranks()),
                        f"; rank processes: pids {pids}" if self.procs else "")
        else:
            logger.info("started %d rank process(es) (TP %d x PP %d): pids %s",
                        len(self.procs), self.tp, self.pp, pids)

    # -- start-up handshake ---------------------------------------------------------------

    def link(self) -> DriverLink:
        return DriverLink(self)

    def _collect(self, kind: str) -> list[Any]:
        """One ``kind`` message from every local rank and remote node; an error or an
        end stops all."""
        try:
            return collect(self.local + self.nodes, kind)
        except GlowlmError as exc:
            self._stop_nodes(str(exc))
            self.shutdown()
            raise

    def _send_all(self, message: Any) -> None:
        for c in self.conns:
            c.send(message)
        for node in self.nodes:
            node.conn.send_bytes(pickle.dumps(message))

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
        self.comms.connect()
        self._collect("gloo")
        return blocks

    # -- steps ----------------------------------------------------------------------------

    def broadcast(self, payload: Any) -> None:
        """Send a step (or None: stop) to every rank: remote nodes over their connection
        (first, so the network time overlaps), this host's ranks through shared memory."""
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        for node in self.nodes:
            try:
                node.conn.send_bytes(data)
            except OSError:
                if self._failure is None:
                    self._failure = f"{node.gone()}; stopped all {self.world} ranks"
                raise RankFailure(self._failure) from None
        if self.comms.world is not None:
            self.comms.world.broadcast_bytes(data)

    # -- failure and shutdown ---------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        return self._failure

    def _watch(self) -> None:
        while not self._stopping:
            watched: dict[Any, Peer] = {p.proc.sentinel: p for p in self.local}
            if self._in_loop:  # during start-up the handshake reads the nodes' messages
                watched.update({n.conn: n for n in self.nodes})
            if not watched:
                return
            try:
                ready = mpc.wait(list(watched), timeout=0.5)
            except (OSError, ValueError):
                return  # connections closed by shutdown
            for obj in ready:
                with self._lock:
                    if self._stopping or self._failure is not None:
                        return
                    line = f"{self._what_ended(watched[obj])}; stopped all {self.world} ranks"
                    self._failure = line
                if self._in_loop:  # during start-up _collect says it
                    logger.error("%s", line)
                self.comms.abort(line)
                self._stop_nodes(line)
                terminate(self.procs)
                return

    def _what_ended(self, peer: Peer) -> str:
        """What a local rank's end or a remote node's message / closed connection means."""
        if peer.proc is not None:
            return peer.gone()
        try:
            tag, value = recv(peer)
            return value if tag in ("failed", "stop", "error") else peer.gone()
        except (EOFError, OSError, pickle.UnpicklingError):
            return peer.gone()

    def _diagnose(self) -> None:
        """A step failed before the monitor saw why (a gloo call noticed first): look
        for the rank or node that ended, so the failure names it."""
        with self._lock:
            if self._failure is not None or not self._in_loop:
                return
            for peer in self.local:
                if not peer.proc.is_alive():
                    self._failure = f"{peer.gone()}; stopped all {self.world} ranks"
                    return
            with contextlib.suppress(OSError, ValueError):
                for node in self.nodes:
                    if mpc.wait([node.conn], timeout=0.05):
                        self._failure = (f"{self._what_ended(node)}; stopped all "
                                         f"{self.world} ranks")
                        return

    def _stop_nodes(self, reason: str) -> None:
        """Tell every remote node to stop its ranks (one line, the reason)."""
        hosts.stop_nodes([node.conn for node in self.nodes], reason)

    def shutdown(self) -> None:
        """Stop every rank (a clean stop message when they are in the step loop)."""
        if self._stopping:
            return
        comms = getattr(self, "comms", None)
        if comms is not None and self._in_loop and any(g.aborted for g in comms.groups()):
            self._diagnose()
        self._stopping = True
        clean = (comms is not None and self._failure is None and self._in_loop
                 and all(p.is_alive() for p in self.procs))
        if clean:
            with contextlib.suppress(Exception):
                # Only reaches ranks already in their step loop; others get SIGTERM below.
                self.broadcast(None)
                deadline = time.monotonic() + 5.0
                for p in self.procs:
                    p.join(max(0.0, deadline - time.monotonic()))
        if comms is not None:
            comms.abort("the engine is shutting down")
        self._stop_nodes(self._failure or "the driver (node 0) is shutting down")
        terminate(self.procs)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
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
