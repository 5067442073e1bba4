"""The TCP link between hosts of a multi-host group (``--nnodes N``).

Node 0's executor listens at ``--master-addr:--master-port``; each other host's
headless command (:mod:`glowlm.executor.node`) connects there, both sides prove
they speak the same protocol (``multiprocessing``'s challenge with :data:`AUTHKEY`),
the node says hello (its node rank, sizes and model shape) and the driver answers
with the engine configuration. From then on every message is a pickled
``(tag, value)`` tuple or a step, except a stop notice (:data:`STOP_PREFIX` and one
line of reason), which either side can read without unpickling.

This module holds both ends of that link; the driver's side of nodes joining is
:mod:`glowlm.executor.join`, and the start-up handshake that runs over the link (and
over the local ranks' pipes) is :mod:`glowlm.executor.executor`'s.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import os
import pickle
import random
import socket
import time
from pathlib import Path
from typing import Any

from glowlm.errors import GlowlmError
from glowlm.logger import init_logger

logger = init_logger(__name__)


def free_port() -> int:
    """A free TCP port below the kernel's ephemeral range, where one exists.

    Why not the port ``bind(0)`` gives: it is an ephemeral port, and a process that keeps
    connecting to it before its listener is up (the ranks dialling the master port, a
    ``--headless`` node) can be handed that very port as its own source port, which Linux
    turns into a connection to itself; the listener then fails with EADDRINUSE (seen once
    in CI).
    """
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(64 if low > 11000 else 0):
        port = rng.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Seconds the driver waits for the other hosts' commands to connect.
NODE_JOIN_TIMEOUT = 900.0
#: vLLM's default --master-port.
DEFAULT_MASTER_PORT = 29501
#: Shared by every glowlm of the same protocol: a stray connection fails the challenge
#: instead of being unpickled. It is no secret: run several hosts on a private network.
AUTHKEY = b"glowlm-nodes-1"
#: A message to a remote node that is not a pickled step: stop, with the reason after it.
STOP_PREFIX = b"stop:"


def master_address(config: Any) -> tuple[str, int]:
    """(address, port) the hosts meet at: flags, then MASTER_ADDR / MASTER_PORT, then
    vLLM's defaults (127.0.0.1:29501)."""
    addr = config.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = config.master_port or int(os.environ.get("MASTER_PORT") or DEFAULT_MASTER_PORT)
    return addr, int(port)


def decode(data: bytes) -> tuple[str, Any]:
    """One message from the other host: a pickled (tag, value), or a stop notice."""
    if data.startswith(STOP_PREFIX):
        return "stop", data[len(STOP_PREFIX):].decode(errors="replace")
    return pickle.loads(data)


def set_socket_options(sock: Any, timeout: float | None) -> None:
    """No Nagle delay on step messages; ``timeout``: a blocking read gives up after it
    (SO_RCVTIMEO: the descriptor stays blocking, as multiprocessing's Connection needs)."""
    import struct

    s = sock if isinstance(sock, socket.socket) else socket.socket(fileno=sock.fileno())
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        secs = 0 if timeout is None else int(timeout)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", secs, 0))
    finally:
        if s is not sock:
            s.detach()


def listen(addr: str, port: int) -> socket.socket:
    """The driver's listening socket (opened before the ranks start: a busy port fails
    at once)."""
    try:
        sock = socket.create_server((addr, port), backlog=64)
    except OSError as exc:
        raise GlowlmError(f"cannot listen for the other hosts at {addr}:{port} "
                          f"(--master-addr/--master-port): {exc.strerror or exc}") from None
    return sock


def stop_nodes(conns: list[Any], reason: str) -> None:
    """Tell every remote node to stop its ranks (one line, the reason), and close."""
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.send_bytes(STOP_PREFIX + reason.encode())
        with contextlib.suppress(Exception):
            conn.close()


def connect(addr: str, port: int) -> Any:
    """A node's connection to the driver, retrying while node 0 is not listening yet."""
    deadline = time.monotonic() + NODE_JOIN_TIMEOUT
    said = False
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=10.0)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise GlowlmError(f"cannot reach the driver (node 0) at {addr}:{port} within "
                                  f"{NODE_JOIN_TIMEOUT:.0f} s: {exc.strerror or exc}; check "
                                  "--master-addr / --master-port") from None
            if not said:
                logger.info("waiting for node 0 at %s:%d (%s)", addr, port,
                            exc.strerror or exc)
                said = True
            time.sleep(0.5)
    sock.settimeout(None)
    set_socket_options(sock, timeout=30.0)
    conn = mpc.Connection(sock.detach())
    try:
        mpc.answer_challenge(conn, AUTHKEY)
        mpc.deliver_challenge(conn, AUTHKEY)
    except (OSError, EOFError, mpc.AuthenticationError) as exc:
        conn.close()
        raise GlowlmError(f"{addr}:{port} is not a glowlm driver of the same version "
                          f"({exc})") from None
    return conn
