"""Other hosts joining the driver's group (``--nnodes N``): the driver's side.

Node 0 waits for nodes 1..N-1 on its listening socket (:mod:`glowlm.executor.hosts`
holds the link itself), checks each hello against its own sizes and checkpoint
(:func:`check_hello`: every host needs the same ``-tp``/``-pp``/``--nnodes`` and the
same model shape, :func:`describe_model`) and sends each the engine configuration.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import pickle
import socket
import time
from typing import Any

from glowlm.errors import GlowlmError
from glowlm.executor.hosts import AUTHKEY, NODE_JOIN_TIMEOUT, set_socket_options
from glowlm.executor.procs import span
from glowlm.logger import init_logger

logger = init_logger(__name__)


def describe_model(config: Any) -> str:
    """The checkpoint's shape, compared between hosts (paths may differ, sizes may not)."""
    from glowlm.engine.memory import model_dims
    from glowlm.model_loader.loader import read_model_dir

    info = read_model_dir(config.model, getattr(config, "revision", None),
                          getattr(config, "gguf_file", None),
                          hf_overrides=getattr(config, "hf_overrides", None))
    d = model_dims(info.hf_config)
    arch = ",".join(getattr(info.hf_config, "architectures", None) or ["?"])
    return (f"{arch}: {d.layers} layers, hidden {d.hidden}, {d.heads} heads / {d.kv_heads} "
            f"KV heads, vocab {d.vocab}")


def headless_command(config: Any, addr: str, port: int) -> str:
    """The command another host runs to join (the driver logs it while it waits)."""
    sizes = f"-tp {config.tensor_parallel_size}"
    if config.pipeline_parallel_size > 1:
        sizes += f" -pp {config.pipeline_parallel_size}"
    return (f"glowlm serve {config.model} {sizes} --nnodes {config.nnodes} --node-rank n "
            f"--master-addr {addr} --master-port {port} --headless")


def accept_nodes(listener: socket.socket, config: Any, local: list[Any], addr: str,
                 control: int) -> list[tuple[int, Any, str]]:
    """Wait for nodes 1..N-1 to connect and say hello; send each the engine config.

    ``local`` are this host's rank peers (one that ends meanwhile stops the wait with
    its own line). Returns (node rank, connection, "host, pid N") in node order."""
    nnodes = config.nnodes
    local_world = config.tensor_parallel_size * config.pipeline_parallel_size // nnodes
    expected = set(range(1, nnodes))
    nodes: dict[int, tuple[Any, str]] = {}
    logger.info("waiting for %d other host(s) at %s:%d; on host n (1..%d) run: %s",
                len(expected), addr, control, nnodes - 1,
                headless_command(config, addr, control))
    mine = describe_model(config)
    deadline = time.monotonic() + NODE_JOIN_TIMEOUT
    while expected - set(nodes):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = ", ".join(map(str, sorted(expected - set(nodes))))
            raise GlowlmError(f"node(s) {missing} of --nnodes {nnodes} did not join "
                              f"within {NODE_JOIN_TIMEOUT:.0f} s at {addr}:{control}")
        ready = mpc.wait([listener, *[p.proc.sentinel for p in local]],
                         timeout=min(left, 1.0))
        for obj in ready:
            if obj is not listener:
                peer = next(p for p in local if p.proc.sentinel == obj)
                raise GlowlmError(f"{peer.gone()} during start-up")
        if listener not in ready:
            continue
        sock, peer_addr = listener.accept()
        set_socket_options(sock, timeout=30.0)  # a silent stranger cannot stall us
        conn = mpc.Connection(sock.detach())
        try:
            mpc.deliver_challenge(conn, AUTHKEY)
            mpc.answer_challenge(conn, AUTHKEY)
            tag, hello = pickle.loads(conn.recv_bytes())
            if tag != "hello" or not isinstance(hello, dict):
                raise ValueError(f"expected a hello, got {tag!r}")
        except (OSError, EOFError, mpc.AuthenticationError, pickle.UnpicklingError,
                ValueError, TypeError) as exc:
            logger.warning("ignored a connection from %s:%d that is not a glowlm node "
                           "(%s)", peer_addr[0], peer_addr[1], exc)
            conn.close()
            continue
        set_socket_options(conn, timeout=None)
        node = hello.get("node_rank")
        problem = check_hello(hello, config, mine, set(nodes))
        if problem:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(("error", problem)))
            conn.close()
            raise GlowlmError(problem)
        where = f"{hello.get('host', peer_addr[0])}, pid {hello.get('pid')}"
        nodes[node] = (conn, where)
        logger.info("node %d joined from %s (%s): %s", node, peer_addr[0], where,
                    span(range(node * local_world, node * local_world + local_world)))
    for n in sorted(nodes):
        nodes[n][0].send_bytes(pickle.dumps(("config", config)))
    return [(n, *nodes[n]) for n in sorted(nodes)]


def check_hello(hello: dict[str, Any], config: Any, mine: str, joined: set[int]
                ) -> str | None:
    """Why a node's hello does not fit node 0's group (None: it fits)."""
    tp, pp, nnodes = config.tensor_parallel_size, config.pipeline_parallel_size, config.nnodes
    node = hello.get("node_rank")
    theirs = (hello.get("tp"), hello.get("pp"), hello.get("nnodes"))
    if theirs != (tp, pp, nnodes):
        return (f"node {node} was started with -tp {theirs[0]} -pp {theirs[1]} --nnodes "
                f"{theirs[2]}, node 0 with -tp {tp} -pp {pp} --nnodes "
                f"{nnodes}; every host needs the same sizes")
    if not isinstance(node, int) or not 1 <= node < nnodes:
        return f"a node joined with --node-rank {node}; expected 1..{nnodes - 1}"
    if node in joined:
        return f"two hosts were started with --node-rank {node}"
    if hello.get("model") != mine:
        return (f"node {node}'s model ({hello.get('model')}) differs from node 0's "
                f"({mine}); every host needs the same checkpoint")
    return None
