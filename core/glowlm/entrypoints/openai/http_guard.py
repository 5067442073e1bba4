"""What one HTTP client may cost the server: authentication, body size, header/body/idle time.

Three layers, each where the protocol allows it:

- :class:`GuardedH11Protocol` (uvicorn's h11 protocol, one per connection)
  closes a connection whose request headers are not complete within
  ``header_timeout`` seconds of its opening or of its previous response. uvicorn
  alone only has a keep-alive timer, which any byte resets, so a client sending
  a header line a minute (or nothing at all after the first byte) would hold its
  socket for ever.
- :class:`APIKeyMiddleware` answers 401 before anything else reads the request,
  comparing keys in constant time.
- :class:`BodyLimitMiddleware` reads the whole body before the app sees it:
  past ``max_body_bytes`` (declared by ``Content-Length`` or counted while a
  chunked body streams in) it answers 413, past ``body_timeout`` 408, and a
  client that disconnects half-way is logged as that, not as a server error.

The rest is uvicorn's own: ``timeout_keep_alive`` closes idle keep-alive
connections, ``limit_concurrency`` answers 503 once that many connections or
requests are open, and h11 refuses request heads over 16 KiB (400).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from glowlm.entrypoints.openai.errors import error_body
from glowlm.logger import init_logger

logger = init_logger(__name__)

#: Paths answered without an API key: probes and scrapers carry no credentials.
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})

#: A body over the limit is still read (and dropped) up to this many times the limit
#: before the 413 is sent: a client that writes its whole body before reading the answer
#: then gets the 413, not a connection reset. Past it the connection is closed at once.
_DRAIN_FACTOR = 4


@dataclass(frozen=True)
class HTTPLimits:
    """The per-connection limits (flags of ``glowlm serve``, env ``GLOWLM_HTTP_*``)."""

    max_body_bytes: int = 8 * 2**20
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keep_alive_timeout: float = 5.0
    limit_concurrency: int | None = 1024


def _close_response(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error", None, code),
                        status_code=status, headers={"Connection": "close"})


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


class BodyLimitMiddleware:
    """Read the body whole (bounded in size and time), then hand it to the app."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.timeout = body_timeout

    def _too_large(self, size: int | str) -> JSONResponse:
        return _close_response(413, f"the request body ({size} bytes) exceeds this server's "
                               f"limit of {self.limit} bytes (--max-request-body-bytes)",
                               "request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        expects_continue = False
        for name, value in scope["headers"]:
            if name == b"expect" and value.strip().lower() == b"100-continue":
                expects_continue = True
            if name == b"content-length":
                if not value.strip().isdigit():  # h11 already refuses these; belt and braces
                    await _close_response(400, "invalid Content-Length", "invalid_body")(
                        scope, receive, send)
                    return
                declared = int(value)
        # A client waiting for "100 Continue" sends nothing more: answer at once.
        limit = self.limit if expects_continue else _DRAIN_FACTOR * self.limit
        if declared is not None and declared > limit:
            await self._too_large(declared)(scope, receive, send)
            return
        body = await self._read(scope, receive, send, declared)
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # only http.disconnect can follow

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive, send: Send,
                    declared: int | None) -> bytes | None:
        """The body, or None once an error response was sent (or the client left)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                logger.info("%s did not send the body of %s %s within %.0f s (%d bytes "
                            "received): 408", _client(scope), scope["method"], scope["path"],
                            self.timeout, size)
                await _close_response(408, f"the request body was not received within "
                                      f"{self.timeout:.0f} s", "request_timeout")(
                    scope, receive, send)
                return None
            if message["type"] == "http.disconnect":
                logger.info("%s disconnected while sending the body of %s %s (%d of %s "
                            "bytes received)", _client(scope), scope["method"], scope["path"],
                            size, declared if declared is not None else "?")
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.limit:
                chunks.append(chunk)
            else:
                chunks.clear()  # over the limit: keep reading to drain, keep nothing
                if size > _DRAIN_FACTOR * self.limit:
                    await self._too_large(f"more than {size}")(scope, receive, send)
                    return None
            if not message.get("more_body", False):
                break
        if size > self.limit:
            await self._too_large(size)(scope, receive, send)
            return None
        return b"".join(chunks)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class APIKeyMiddleware:
    """401 for a missing or wrong ``Authorization: Bearer`` key on every path but
    :data:`OPEN_PATHS` (pure ASGI, so streams pass through untouched).

    Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, against
    every configured key, so neither the time taken nor an early exit tells a
    client how much of a key it got right, how long a key is, or which key matched.
    """

    def __init__(self, app: ASGIApp, api_keys: Iterable[str]) -> None:
        self.app = app
        self.expected = [_digest(f"Bearer {k}".encode()) for k in api_keys]
        if not self.expected:
            raise ValueError("APIKeyMiddleware needs at least one key")

    def authorized(self, given: bytes | None) -> bool:
        if given is None:
            return False
        digest = _digest(given)
        ok = False
        for expected in self.expected:
            ok |= hmac.compare_digest(digest, expected)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"][len(scope.get("root_path", "")):] or "/"
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if self.authorized(given):
            await self.app(scope, receive, send)
            return
        why = "missing" if given is None else "wrong"
        response = JSONResponse(error_body(
            f"{why} API key: send 'Authorization: Bearer <key>'", "authentication_error",
            None, "invalid_api_key"), status_code=401,
            headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers.

    The timer starts when the connection opens and again when a response
    completes; it is cancelled as soon as a request's headers are parsed. If it
    fires while no request is being served, the connection is closed (there is
    no HTTP way to answer a request whose head never arrived).
    """

    header_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._idle() and not self.transport.is_closing():
            if self.logger.isEnabledFor(logging.DEBUG):
                self.logger.debug("closing a connection whose request headers did not arrive "
                                  "within %.0f s", self.header_timeout)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if not self._idle():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._idle() and not self.transport.is_closing():
            self._arm()


def guarded_protocol(header_timeout: float) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` class with this header timeout (uvicorn's ``http=``)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout": header_timeout})


def raise_open_file_limit(wanted: int) -> None:
    """Raise the soft open-file limit towards ``wanted`` (at most the hard limit), so the
    connection cap, not EMFILE in ``accept()``, is what bounds open connections."""
    try:
        import resource
    except ImportError:  # not on this OS
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            logger.warning("cannot raise the open-file limit from %d to %d; connections "
                           "past it fail in accept()", soft, target)
