"""The OpenAI-compatible HTTP server: FastAPI on uvicorn, one engine shared by all requests.

The engine runs in this process, stepped by one asyncio task on one engine
thread (see :mod:`glowlm.entrypoints.openai.engine_loop`); docs/server.md says
why. Request bodies are parsed here rather than by FastAPI so every malformed
or invalid body becomes an OpenAI-shaped 4xx naming the field.

Shutdown (Ctrl-C, SIGTERM): stop accepting connections, let open requests
finish for up to ``--graceful-shutdown-timeout`` seconds, then end the rest
(a stream gets an error event and ``[DONE]``, a plain request a 503), stop the
engine thread and exit 0. A second Ctrl-C or SIGTERM exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, PlainTextResponse, Response

from glowlm import __version__
from glowlm.engine.llm_engine import LLMEngine
from glowlm.entrypoints.openai.engine_loop import AsyncEngine
from glowlm.entrypoints.openai.errors import APIError, error_body
from glowlm.entrypoints.openai.http_guard import (
    OPEN_PATHS,
    APIKeyMiddleware,
    BodyLimitMiddleware,
    HTTPLimits,
    guarded_protocol,
    raise_open_file_limit,
)
from glowlm.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from glowlm.entrypoints.openai.openapi import install_openapi
from glowlm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
    parse_request,
)
from glowlm.entrypoints.openai.serving_chat import OpenAIServingChat
from glowlm.entrypoints.openai.serving_completions import OpenAIServingCompletion
from glowlm.entrypoints.openai.serving_models import ServedModels
from glowlm.entrypoints.openai.serving_pooling import OpenAIServingPooling
from glowlm.logger import init_logger

logger = init_logger(__name__)

__all__ = ["OPEN_PATHS", "ServerOptions", "build_app", "serve"]


@dataclass
class ServerOptions:
    served_model_names: list[str]
    #: Any of these is accepted as ``Authorization: Bearer KEY``; empty: no key needed.
    api_keys: list[str] = field(default_factory=list)
    limits: HTTPLimits = field(default_factory=HTTPLimits)
    chat_template: str | None = None
    max_queue: int | None = None
    # Request defaults (--generation-config), logprob limit, tool calling, CORS, stats log:
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    max_logprobs: int = 20
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    log_stats: bool = True
    #: GLOWLM_ALLOW_RUNTIME_LORA_UPDATING: /v1/load_lora_adapter and
    #: /v1/unload_lora_adapter answer (with --enable-lora); off, they are a 404.
    allow_runtime_lora_updating: bool = False


def _api_error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def build_app(engine: LLMEngine, options: ServerOptions,
              executor: ThreadPoolExecutor | None = None) -> FastAPI:
    """The ASGI app; the engine loop starts and stops with the app's lifespan.

    ``executor`` is the engine thread, if the engine was built on one (see
    :func:`glowlm.entrypoints.openai.engine_loop.engine_thread`).
    """
    names = options.served_model_names
    metrics = ServerMetrics(names[0], log_stats=options.log_stats)
    driver = AsyncEngine(engine, metrics, options.max_queue, executor)
    metrics.snapshot_source = lambda: driver.snapshot  # for the periodic throughput line
    #: The base names and the LoRA adapters (--lora-modules, /v1/load_lora_adapter),
    #: one registry every endpoint reads.
    models = ServedModels(driver, names, options.allow_runtime_lora_updating)
    completions = OpenAIServingCompletion(driver, names, options, models=models)
    chat = OpenAIServingChat(driver, names, options.chat_template, options, models=models)
    #: a pooling engine (glowlm serve --runner pooling) serves the pooling routes only
    pooling = bool(getattr(engine, "is_pooling", False))
    pool = OpenAIServingPooling(driver, names, options, models=models)

    def generation_route(route: str) -> None:
        if pooling:
            raise APIError(f"{route} generates text, and this server runs a pooling model "
                           "(--runner pooling): use /v1/embeddings, /score, /rerank, "
                           "/classify or /pooling", code="unsupported_route")

    def pooling_route(route: str) -> None:
        if not pooling:
            raise APIError(f"{route} needs a pooling model; this server generates text. "
                           "Serve an embedding or reranking model, or this one with "
                           "--runner pooling", code="unsupported_route")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        driver.start()
        try:
            yield
        finally:
            if driver.snapshot.num_unfinished:
                logger.info("shutting down: aborting %d unfinished request(s)",
                            driver.snapshot.num_unfinished)
            await driver.shutdown()

    app = FastAPI(title="glowlm", version=__version__, lifespan=lifespan)
    app.state.driver = driver
    # Starlette runs the last added outermost: auth, then the body limits, then the app.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=options.limits.max_body_bytes,
                       body_timeout=options.limits.body_timeout)
    if options.api_keys:
        app.add_middleware(APIKeyMiddleware, api_keys=options.api_keys)
    install_openapi(app, secured=bool(options.api_keys))
    # Outermost, as in vLLM: a browser's preflight (OPTIONS) is answered before auth.
    app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins,
                       allow_credentials=options.allow_credentials,
                       allow_methods=options.allowed_methods,
                       allow_headers=options.allowed_headers)

    @app.exception_handler(APIError)
    async def on_api_error(_: Request, exc: APIError) -> JSONResponse:
        return _api_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error", None, code),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(exc.errors()[:1])), status_code=400)

    @app.exception_handler(ClientDisconnect)
    async def on_client_gone(raw: Request, _: ClientDisconnect) -> Response:
        client = raw.client
        logger.info("%s disconnected before its request was read",
                    f"{client.host}:{client.port}" if client else "a client")
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(Exception)
    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error while serving a request")
        return JSONResponse(error_body(f"internal server error: {exc!r}", "server_error"),
                            status_code=500)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": models.cards()}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        return models.card(model_id)

    # Always routed (vLLM adds them only with VLLM_ALLOW_RUNTIME_LORA_UPDATING): off,
    # they answer a 404 that says how to turn them on, instead of a bare "Not Found".
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(raw: Request) -> PlainTextResponse:
        models.check_updates_allowed("/v1/load_lora_adapter")
        req: LoadLoRAAdapterRequest = parse_request(LoadLoRAAdapterRequest, await raw.body())
        return PlainTextResponse(await models.load(req.lora_name, req.lora_path))

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(raw: Request) -> PlainTextResponse:
        models.check_updates_allowed("/v1/unload_lora_adapter")
        req: UnloadLoRAAdapterRequest = parse_request(UnloadLoRAAdapterRequest,
                                                      await raw.body())
        return PlainTextResponse(await models.unload(req.lora_name))

    @app.post("/v1/completions")
    async def create_completion(raw: Request) -> Response:
        generation_route("/v1/completions")
        return await completions.create(raw, await raw.body())

    @app.post("/v1/chat/completions")
    async def create_chat_completion(raw: Request) -> Response:
        generation_route("/v1/chat/completions")
        return await chat.create(raw, await raw.body())

    @app.post("/v1/embeddings")
    async def create_embeddings(raw: Request) -> Response:
        pooling_route("/v1/embeddings")
        return await pool.embeddings(raw, await raw.body())

    @app.post("/pooling")
    async def create_pooling(raw: Request) -> Response:
        pooling_route("/pooling")
        return await pool.pooling(raw, await raw.body())

    @app.post("/classify")
    async def create_classify(raw: Request) -> Response:
        pooling_route("/classify")
        return await pool.classify(raw, await raw.body())

    @app.post("/score")
    @app.post("/v1/score")
    async def create_score(raw: Request) -> Response:
        pooling_route("/score")
        return await pool.score(raw, await raw.body())

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def create_rerank(raw: Request) -> Response:
        pooling_route("/rerank")
        return await pool.rerank(raw, await raw.body())

    @app.get("/health")
    @app.get("/ping")
    async def health() -> Response:
        if not driver.alive:
            return JSONResponse(error_body("the engine loop is not running", "server_error"),
                                status_code=503)
        failed = getattr(driver.engine, "failure", None)  # a TP/PP rank or host gone
        if failed:
            return JSONResponse(error_body(failed, "server_error"), status_code=503)
        dead = getattr(driver.engine, "dead_replicas", None)  # glowlm serve -dp N
        if dead:
            return JSONResponse(error_body("data-parallel " + "; ".join(dead), "server_error"),
                                status_code=503)
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def get_metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(driver.snapshot), media_type=CONTENT_TYPE)

    @app.post("/tokenize")
    async def tokenize(raw: Request) -> dict[str, Any]:
        req: TokenizeRequest = parse_request(TokenizeRequest, await raw.body())
        completions.model_name(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError("give exactly one of prompt or messages", param="prompt")
        if req.messages is not None:
            msgs = [m.template_dict() for m in req.messages]
            ids = await driver.run_tokenizer(chat.render, msgs, req.add_generation_prompt)
        else:
            ids = await driver.run_tokenizer(driver.tokenize, req.prompt,
                                             req.add_special_tokens)
        strs = await driver.run_tokenizer(driver.token_texts, ids) \
            if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(raw: Request) -> dict[str, Any]:
        req: DetokenizeRequest = parse_request(DetokenizeRequest, await raw.body())
        completions.model_name(req.model)
        if any(not 0 <= t < engine.vocab_size for t in req.tokens):
            raise APIError(f"tokens must be in [0, {engine.vocab_size})", param="tokens")
        text = await driver.run_tokenizer(driver.tokenizer.decode, req.tokens)
        return {"prompt": text}

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before loading the model, so a busy port fails in a second, not after the load."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        from glowlm.errors import ConfigError

        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another "
                          "--port or stop what is using it") from None
    sock.set_inheritable(True)
    return sock


class GracefulServer(uvicorn.Server):
    """uvicorn's server with glowlm's shutdown policy.

    uvicorn alone would cancel the open request tasks when its graceful timeout
    expires (a traceback per request, streams cut without an error) and then
    re-raise the signal, so the process dies by SIGTERM. Here the driver ends
    the remaining requests itself when the drain time is up, so every client
    gets a well-formed ending, and a signal-initiated shutdown exits 0.
    """

    FORCE_AFTER = 2.0  # seconds the second signal leaves for the endings to be written

    def __init__(self, config: uvicorn.Config, driver: AsyncEngine, drain_seconds: float) -> None:
        super().__init__(config)
        self.driver = driver
        self.drain_seconds = drain_seconds
        self._stopping = False  # a second signal came: requests ended, exit when written

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A second SIGINT *or* SIGTERM stops at once (uvicorn forces only on SIGINT, so
        a supervisor's second SIGTERM would otherwise wait out the whole drain).

        "At once" still lets each client read its ending: the second signal ends every
        request now (a stream gets its error event and [DONE], a plain request a 503)
        and uvicorn's drain then finishes as soon as those responses are written and
        the connections close; only if that takes longer than ``FORCE_AFTER`` seconds
        (or a third signal comes) does uvicorn drop the connections. Forcing at the
        second signal itself raced the responses: a request ended a moment before the
        process exited could lose its 503 to a connection reset.
        """
        if not self.should_exit:
            super().handle_exit(sig, frame)
            return
        if self._stopping or self.driver.loop is None:
            self.force_exit = True
            return
        self._stopping = True
        loop = self.driver.loop
        loop.call_soon_threadsafe(self.driver.cancel_all, "the server was stopped")
        loop.call_soon_threadsafe(loop.call_later, self.FORCE_AFTER, self._force)

    def _force(self) -> None:
        self.force_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        pending = self.driver.snapshot.num_unfinished
        if pending:
            logger.info("draining %d request(s) for up to %.0f s", pending, self.drain_seconds)
        timer = asyncio.get_running_loop().call_later(
            self.drain_seconds, self.driver.cancel_all, "the server is shutting down")
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def serve(engine: LLMEngine, options: ServerOptions, sock: socket.socket, *,
          executor: ThreadPoolExecutor | None = None, graceful_shutdown_timeout: float = 30.0,
          access_log: bool = True, uvicorn_options: dict[str, Any] | None = None) -> None:
    """Run uvicorn on an already bound socket until Ctrl-C / SIGTERM.

    ``uvicorn_options``: ``log_level``, ``root_path`` and the ``ssl_*`` settings
    (TLS is uvicorn's own), as ``glowlm serve`` passes them.
    """
    app = build_app(engine, options, executor)
    host, port = sock.getsockname()[:2]
    limits = options.limits
    if limits.limit_concurrency:
        raise_open_file_limit(limits.limit_concurrency + 256)
    extra = {k: v for k, v in (uvicorn_options or {}).items() if v is not None}
    extra.setdefault("log_level", "info")
    # uvicorn's own timeout is only a backstop: GracefulServer ends requests first.
    config = uvicorn.Config(app, access_log=access_log,
                            timeout_graceful_shutdown=graceful_shutdown_timeout + 10,
                            timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]
                            limit_concurrency=limits.limit_concurrency,
                            http=guarded_protocol(limits.header_timeout), **extra)
    scheme = "https" if extra.get("ssl_certfile") else "http"
    logger.info("serving %s on %s://%s:%d%s (OpenAI API under /v1)",
                json.dumps(options.served_model_names), scheme, host, port,
                extra.get("root_path", ""))
    GracefulServer(config, app.state.driver, graceful_shutdown_timeout).run(sockets=[sock])
    # Everything is stopped: skip the interpreter's last full garbage collection of the
    # engine's and libraries' objects (seconds of CPU on exit, measured 5-7 s with the
    # tiny test model), so a stopped server exits when its requests have ended.
    gc.freeze()
