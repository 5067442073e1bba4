"""This host's rank processes: starting them, hearing from them, naming and ending them.

Used by the driver (:mod:`glowlm.executor.executor`) and by a headless node
(:mod:`glowlm.executor.node`) alike: both start their host's ranks with ``spawn``
(:func:`spawn_ranks`; each runs :func:`glowlm.executor.worker.worker_main`), collect
each start-up step's message from every peer (:func:`collect`: a local rank's pipe or
a remote node's connection) and stop them (:func:`terminate`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from glowlm.distributed.groups import Layout
from glowlm.errors import GlowlmError
from glowlm.executor import hosts

#: Seconds a rank may take from spawn to "planned" and from "load" to "loaded".
SETUP_TIMEOUT = 1800.0

def span(ranks: range) -> str:
    """'rank 2' or 'ranks 2-3'."""
    return f"rank {ranks.start}" if len(ranks) == 1 else f"ranks {ranks.start}-{ranks.stop - 1}"


def exit_description(code: int | None) -> str:
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


@dataclass
class Peer:
    """One party of the start-up handshake: a local rank (``proc``) or a remote node."""

    label: str          # "rank 1" / "node 1"
    conn: Any
    proc: Any = None    # the rank's process; None for a remote node
    node: int = 0       # the remote node's rank
    where: str = ""     # the remote node's host and pid

    def gone(self) -> str:
        if self.proc is not None:
            self.proc.join(0.5)
            return f"{self.label} (pid {self.proc.pid}) {exit_description(self.proc.exitcode)}"
        return f"{self.label} ({self.where}) went away: its connection closed"


def collect(peers: list[Peer], kind: str) -> list[Any]:
    """One ``kind`` message from every peer, in order; raises GlowlmError naming the
    first peer that reports an error or ends (the caller stops the others)."""
    values: dict[int, Any] = {}
    deadline = time.monotonic() + SETUP_TIMEOUT
    while len(values) < len(peers):
        waiting = [i for i in range(len(peers)) if i not in values]
        handles = {id(peers[i].conn): i for i in waiting}
        sentinels = {peers[i].proc.sentinel: i for i in waiting if peers[i].proc is not None}
        ready = mpc.wait([peers[i].conn for i in waiting] + list(sentinels),
                         timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise GlowlmError(f"rank start-up timed out waiting for {kind!r}")
        for obj in ready:
            if id(obj) in handles:
                i = handles[id(obj)]
                peer = peers[i]
                try:
                    tag, value = recv(peer)
                except EOFError:
                    if peer.proc is None:
                        raise GlowlmError(f"{peer.gone()} during start-up") from None
                    continue  # a local rank: its sentinel says why
                if tag == "error":
                    # A node's errors already name their rank.
                    raise GlowlmError(value if peer.proc is None else f"{peer.label}: {value}")
                if tag == "stop":
                    raise GlowlmError(value)
                values[i] = value
            else:
                i = sentinels[obj]
                if i not in values:
                    raise GlowlmError(f"{peers[i].gone()} during start-up")
    return [values[i] for i in range(len(peers))]


def recv(peer: Peer) -> tuple[str, Any]:
    """A handshake message; remote nodes send pickled tuples, or a stop notice."""
    if peer.proc is not None:
        return peer.conn.recv()
    try:
        data = peer.conn.recv_bytes()
    except OSError:
        raise EOFError from None
    return hosts.decode(data)


def spawn_ranks(config: Any, layout: Layout, ranks: range, addr: str, port: int
                ) -> list[Peer]:
    """Start ``ranks`` of this host as processes (spawn); each reports over its pipe."""
    from glowlm.executor.worker import worker_main

    ctx = mp.get_context("spawn")
    peers = []
    for rank in ranks:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker_main, name=f"glowlm-rank{rank}",
                           args=(config, layout, rank, child, addr, port, os.getpid()),
                           daemon=True)
        proc.start()
        child.close()
        peers.append(Peer(f"rank {rank}", parent, proc))
    return peers


def terminate(procs: list[Any], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    for p in procs:
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            with contextlib.suppress(Exception):
                p.kill()
            p.join(1.0)
