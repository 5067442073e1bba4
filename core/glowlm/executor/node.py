"""A headless node: this host's ranks of a group whose driver runs on another host.

``glowlm serve MODEL -tp 4 --nnodes 2 --node-rank 1 --master-addr HOST0 --headless``
(vLLM's flags) runs no API server. It connects to the driver's command on node 0
at ``--master-addr:--master-port`` (retrying until node 0 listens), says which
node it is, receives the engine configuration node 0 runs with (dtype, lengths,
KV cache: the same on every host; only the model path is this host's), starts
its ranks n*L .. n*L+L-1 as processes and relays the start-up handshake for them.

In the step loop this process is the relay: each step's inputs arrive over the
TCP connection and go to its ranks through its own shared-memory group (it is
index 0 there, as the driver is on node 0). Its monitor thread watches the
ranks: one that dies is reported to the driver ("rank 3 (pid N) on node 1 was
killed by SIGKILL"), which stops the whole group. When the driver's connection
closes, or the driver says stop, the ranks are stopped and the command exits
with one line; the ranks die with this process whatever happens
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import socket
import threading
import time
from typing import Any

from glowlm.distributed.groups import Layout
from glowlm.errors import ConfigError, GlowlmError
from glowlm.executor.hosts import (
    STOP_PREFIX,
    connect,
    decode,
    master_address,
    set_socket_options,
)
from glowlm.executor.join import describe_model
from glowlm.executor.procs import Peer, collect, span, spawn_ranks, terminate
from glowlm.logger import init_logger

logger = init_logger(__name__)

_STOP = pickle.dumps(None, protocol=pickle.HIGHEST_PROTOCOL)


class HeadlessNode:
    """This host's part of a multi-host group (see the module docstring)."""

    def __init__(self, config: Any) -> None:
        self.given = config
        self.node = config.node_rank
        self.addr, self.port = master_address(config)
        self.conn: Any = None
        self.peers: list[Peer] = []
        self.layout: Layout | None = None
        self._stopping = False
        self._failure: str | None = None

    @property
    def procs(self) -> list[Any]:
        return [p.proc for p in self.peers]

    def _expect(self, tag: str) -> Any:
        try:
            got, value = decode(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise GlowlmError(self._driver_gone()) from None
        if got == "stop":
            raise GlowlmError(f"node 0 stopped the group: {value}")
        if got == "error":
            raise GlowlmError(value)
        if got != tag:
            raise GlowlmError(f"expected {tag!r} from node 0, got {got!r}")
        return value

    def _send(self, message: Any) -> None:
        try:
            self.conn.send_bytes(pickle.dumps(message))
        except OSError:
            raise GlowlmError(self._driver_gone()) from None

    def _driver_gone(self) -> str:
        ranks = self.layout.host_ranks() if self.layout is not None else range(0)
        which = span(ranks) if len(ranks) else "ranks"
        return (f"the driver (node 0 at {self.addr}:{self.port}) went away: its connection "
                f"closed; stopped node {self.node}'s {which}")

    def run(self) -> int:
        from glowlm.distributed.shm import RankFailure, ShmGroup

        self.conn = connect(self.addr, self.port)
        c = self.given
        self._send(("hello", {"node_rank": self.node, "nnodes": c.nnodes,
                              "tp": c.tensor_parallel_size, "pp": c.pipeline_parallel_size,
                              "model": describe_model(c), "host": socket.gethostname(),
                              "pid": os.getpid()}))
        driver_config = self._expect("config")
        set_socket_options(self.conn, timeout=None)  # other hosts may load for a long time
        config = dataclasses.replace(driver_config, model=c.model, revision=c.revision,
                                     gguf_file=c.gguf_file, tokenizer=c.tokenizer,
                                     node_rank=self.node)
        self.layout = Layout.create(config.tensor_parallel_size, config.pipeline_parallel_size,
                                    config.nnodes, self.node)
        relay = ShmGroup(self.layout.world_path, self.layout.world_members, 0, name="world")
        ranks = self.layout.host_ranks()
        self.peers = spawn_ranks(config, self.layout, ranks, self.addr, self.port + 1)
        logger.info("node %d of %d: started %s (pids %s); driver at %s:%d", self.node,
                    config.nnodes, span(ranks), ", ".join(str(p.pid) for p in self.procs),
                    self.addr, self.port)
        try:
            collect(self.peers, "planned")
            self.layout.unlink()  # every rank mapped its segments
            self._send(("planned", None))
            self._expect("load")
            for p in self.peers:
                p.conn.send(("load", None))
            self._send(("loaded", min(collect(self.peers, "loaded"))))
            blocks = self._expect("blocks")
            for p in self.peers:
                p.conn.send(("blocks", blocks))
            collect(self.peers, "gloo")
            self._send(("gloo", None))
        except GlowlmError as exc:
            with contextlib.suppress(Exception):
                self.conn.send_bytes(pickle.dumps(("error", str(exc))))
            raise
        logger.info("node %d: %s ready; relaying steps from node 0", self.node, span(ranks))
        monitor = threading.Thread(target=self._watch, args=(relay,), daemon=True,
                                   name="glowlm-node-monitor")
        monitor.start()
        try:
            while True:
                try:
                    data = self.conn.recv_bytes()
                except (EOFError, OSError):
                    raise GlowlmError(self._failure or self._driver_gone()) from None
                if data.startswith(STOP_PREFIX):
                    reason = data[len(STOP_PREFIX):].decode(errors="replace")
                    raise GlowlmError(self._failure or f"node 0 stopped the group: {reason}")
                if data == _STOP:
                    self._stopping = True  # before the ranks exit: not a failure
                relay.broadcast_bytes(data)
                if data == _STOP:
                    deadline = time.monotonic() + 5.0
                    for p in self.procs:
                        p.join(max(0.0, deadline - time.monotonic()))
                    logger.info("node %d: node 0 stopped the group; exiting", self.node)
                    return 0
        except RankFailure:
            raise GlowlmError(self._failure or "a rank of this node stopped") from None

    def _watch(self, relay: Any) -> None:
        import multiprocessing.connection as mpc

        sentinels = {p.proc.sentinel: p for p in self.peers}
        while not self._stopping:
            ready = mpc.wait(list(sentinels), timeout=0.5)
            if self._stopping or not ready:
                continue
            peer = sentinels[ready[0]]
            line = f"{peer.gone()} on node {self.node}"
            self._failure = f"{line}; stopped node {self.node}"
            with contextlib.suppress(Exception):
                self.conn.send_bytes(pickle.dumps(("failed", line)))
            relay.dead_reason = self._failure
            relay.abort()
            terminate(self.procs)
            return

    def close(self) -> None:
        self._stopping = True
        terminate(self.procs)
        if self.layout is not None:
            self.layout.unlink()
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


def run_headless(config: Any) -> int:
    """``glowlm serve ... --node-rank N --headless``: run this host's ranks until node 0
    stops (exit 0) or the group fails (GlowlmError: one line)."""
    from glowlm.executor.layout import check_layout

    if config.nnodes < 2 or config.node_rank < 1:
        raise ConfigError("--headless runs the ranks of another host: give --nnodes N > 1 "
                          "and --node-rank 1..N-1 (node 0 runs the API server)")
    check_layout(config)  # the same refusal node 0 gives, before connecting
    node = HeadlessNode(config)

    def _terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return node.run()
    finally:
        node.close()
