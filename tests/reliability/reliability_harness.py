"""What the reliability tests share: a real ``glowlm serve``, raw HTTP, metrics, RSS, inotify.

Everything talks to a ``glowlm serve`` subprocess on 127.0.0.1 over real sockets,
as a user's client would; nothing is mocked. The figures each test measures are
recorded with :func:`record` and printed at the end of the run (``make
test-reliability`` prints them as its last lines, from ``report.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from glowlm.testing.server import ServerProcess, scrape_metrics, start_server

MODEL = "tiny"
KEY = "reliability-key"
#: The shared server's settings (conftest.py starts it), which some tests need to know.
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 256
HEADER_TIMEOUT = 3.0
BODY_TIMEOUT = 3.0
AUTH = {"Authorization": f"Bearer {KEY}"}
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"

#: Figures of this run, by name (see :func:`record`); printed by conftest at the end.
FIGURES: dict[str, Any] = {}


def record(name: str, value: Any) -> None:
    """Keep one figure for the end-of-run summary (and the JSON report, if asked for)."""
    FIGURES[name] = value
    path = os.environ.get("GLOWLM_RELIABILITY_REPORT")
    if path:
        p = Path(path)
        data = json.loads(p.read_text()) if p.exists() else {}
        data[name] = value
        p.write_text(json.dumps(data, indent=1, sort_keys=True))


def serve(model: Path, log: Path, *args: str, env: dict[str, str] | None = None
          ) -> ServerProcess:
    """``glowlm serve`` with the suite's key (from ``GLOWLM_API_KEY``, so the variable is
    exercised) on the platform of ``GLOWLM_PLATFORM`` (default: core's reference ops);
    ``env`` adds variables for the server process."""
    full = {"GLOWLM_API_KEY": KEY,
            "GLOWLM_PLATFORM": os.environ.get("GLOWLM_PLATFORM", "generic"), **(env or {})}
    return start_server(model, log, "--served-model-name", MODEL, *args, env=full)


def metrics(server: ServerProcess) -> dict[str, float]:
    return scrape_metrics(server.url, MODEL)


def kv_idle(server: ServerProcess) -> bool:
    """Every KV block free and nothing running or waiting."""
    m = metrics(server)
    return (m["glowlm:num_free_kv_cache_blocks"] == m["glowlm:num_kv_cache_blocks"]
            and m["glowlm:num_requests_running"] == 0
            and m["glowlm:num_requests_waiting"] == 0)


def wait_for(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> float | None:
    """Seconds until ``cond()`` held, or None if it did not within ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(interval)
    return None


def healthy(server: ServerProcess) -> bool:
    try:
        return httpx.get(server.url + "/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def address(server: ServerProcess) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def raw_request(server: ServerProcess, data: bytes, timeout: float = 30.0) -> bytes:
    """Send raw bytes on a fresh connection; everything until the server closes it."""
    with socket.create_connection(address(server), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock, timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def http_status(reply: bytes) -> int:
    """The status of a raw HTTP/1.1 reply (0 if there is none)."""
    if not reply.startswith(b"HTTP/1.1 "):
        return 0
    return int(reply[9:12])


def sse_events(lines: list[str]) -> list[Any]:
    """The JSON payloads of ``data:`` lines; ``[DONE]`` as the string."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


class InotifyWatch:
    """Every open/read/list of files under a directory tree, seen by the kernel (inotify).

    Pure ctypes, no extra package: watches ``root`` and each directory below it for
    IN_OPEN and IN_ACCESS (opening a file, reading it, listing a directory). A path
    that is only ``stat``-ed produces no event: the claim checked is that the
    server never *opens* what a request names.
    """

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, root: Path) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._fd = libc.inotify_init1(self.IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._paths: dict[int, Path] = {}
        for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
            wd = libc.inotify_add_watch(self._fd, str(d).encode(),
                                        self.IN_OPEN | self.IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d} failed")
            self._paths[wd] = d

    def events(self) -> list[str]:
        """Paths opened or read since the last call (drains the queue)."""
        out: list[str] = []
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return out
            i = 0
            while i < len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode(errors="replace")
                out.append(f"{self._paths.get(wd)}/{name} (mask {mask:#x})")
                i += 16 + length

    def close(self) -> None:
        os.close(self._fd)
