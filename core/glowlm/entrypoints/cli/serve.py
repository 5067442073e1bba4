"""``glowlm serve [MODEL]``: the OpenAI-compatible server, with the online engine defaults.

Start-up order: bind the port (a busy port fails at once), apply the thread
binding on the engine thread, build the engine on that same thread (it logs the
platform and why, the dtype and the KV cache in blocks and tokens), then serve.
Heavy imports happen inside ``run`` so ``glowlm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
from typing import Any

from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs
from glowlm.errors import ConfigError
from glowlm.logger import init_logger

logger = init_logger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (a Hugging Face model directory; default: the embedded "
                    "model) with the OpenAI API: /v1/completions, /v1/chat/completions, "
                    "/v1/models, plus /health, /metrics, /tokenize, /detokenize, /version. "
                    "Environment: GLOWLM_CPU_KVCACHE_SPACE (KV cache GiB), "
                    "GLOWLM_CPU_OMP_THREADS_BIND, GLOWLM_CPU_NUM_OF_RESERVED_CPU, "
                    "GLOWLM_PLATFORM.")
    p.add_argument("model", nargs="?", default=None,
                   help="model directory (default: the embedded default model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                   "127.0.0.1; use 0.0.0.0 to accept remote clients)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="name(s) clients use in 'model' (default: the model path)")
    p.add_argument("--api-key", action="append", metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health, "
                        "/ping, /version and /metrics; repeat for several keys (default: "
                        "GLOWLM_API_KEY, else no key)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="Jinja chat template file (default: the tokenizer's)")
    p.add_argument("--max-queue", type=int, metavar="N",
                   help="at most N requests wait for a slot; more get 503 with Retry-After "
                        "(default: unlimited)")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=30.0, metavar="S",
                   help="on Ctrl-C/SIGTERM, let open requests finish for up to S seconds, "
                        "then abort them (default 30)")
    p.add_argument("--disable-access-log", action="store_true",
                   help="do not log one line per HTTP request")
    add_http_limit_args(p)
    add_engine_args(p, online=True)
    p.set_defaults(func=run)


def add_http_limit_args(p: argparse.ArgumentParser) -> None:
    """What one client may cost (docs/server.md, "Limits"); defaults from GLOWLM_* env."""
    g = p.add_argument_group("HTTP limits (defaults: the GLOWLM_* variable named)")
    g.add_argument("--max-request-body-bytes", type=int, metavar="N",
                   help="largest request body read; larger gets 413 "
                        "(GLOWLM_MAX_REQUEST_BODY_BYTES, default 8 MiB)")
    g.add_argument("--request-header-timeout", type=float, metavar="S",
                   help="close a connection whose request headers take longer "
                        "(GLOWLM_HTTP_HEADER_TIMEOUT, default 10)")
    g.add_argument("--request-body-timeout", type=float, metavar="S",
                   help="408 for a request body that takes longer (GLOWLM_HTTP_BODY_TIMEOUT, "
                        "default 60)")
    g.add_argument("--timeout-keep-alive", type=float, metavar="S",
                   help="close idle keep-alive connections after S seconds "
                        "(GLOWLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5)")
    g.add_argument("--limit-concurrency", type=int, metavar="N",
                   help="with N connections or requests open, new requests get 503 "
                        "(GLOWLM_HTTP_LIMIT_CONCURRENCY, default 1024)")


def http_settings(args: argparse.Namespace) -> tuple[list[str], Any]:
    """The API keys and :class:`~glowlm.entrypoints.openai.http_guard.HTTPLimits`: each
    flag if given, else its environment variable."""
    from glowlm import envs
    from glowlm.entrypoints.openai.http_guard import HTTPLimits

    env = envs.server()
    keys = [k for k in (args.api_key or []) if k] or ([env.api_key] if env.api_key else [])

    def pick(flag: str, value: float) -> Any:
        given = getattr(args, flag)
        if given is not None and given <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be > 0, got {given}")
        return value if given is None else given

    limits = HTTPLimits(
        max_body_bytes=pick("max_request_body_bytes", env.max_request_body_bytes),
        header_timeout=pick("request_header_timeout", env.header_timeout),
        body_timeout=pick("request_body_timeout", env.body_timeout),
        keep_alive_timeout=pick("timeout_keep_alive", env.keep_alive_timeout),
        limit_concurrency=pick("limit_concurrency", env.limit_concurrency))
    return keys, limits


def apply_thread_binding() -> str:
    """Bind the calling thread's OpenMP threads (and memory) as glowlm.runtime plans.

    Runs on the engine thread: OpenMP pools and memory policy belong to the thread
    that runs the model, and the front-end keeps the reserved CPU. Returns the log line.
    """
    try:
        binding = importlib.import_module("glowlm.runtime.binding")
    except ModuleNotFoundError as exc:
        if exc.name != "glowlm.runtime.binding":
            raise
        return "thread binding: not configured"
    apply = getattr(binding, "apply_for_process", None)
    if not callable(apply):
        return "thread binding: not configured (glowlm.runtime.binding has no apply_for_process)"
    plan = apply(serving=True)
    for note in getattr(plan, "notes", ()):
        logger.warning("thread binding: %s", note)
    return str(plan.describe())


def read_chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--chat-template {path}: cannot read it ({exc.strerror})") from None


def run(args: argparse.Namespace) -> int:
    if args.max_queue is not None and args.max_queue < 0:
        raise ConfigError("--max-queue must be >= 0")
    chat_template = read_chat_template(args.chat_template)
    api_keys, http_limits = http_settings(args)
    model, name = args.model, args.model
    if model is None:
        from glowlm import default_model

        model, name = default_model.default_model_path(), str(default_model.describe()["name"])
        logger.info("no MODEL given: serving the embedded default model %s (%s)", name, model)
    from glowlm.config import EngineConfig
    from glowlm.entrypoints.openai.server import ServerOptions, bind_socket, serve

    config = EngineConfig.create(
        model, online=True, **engine_kwargs(args),
        served_model_name=args.served_model_name[0] if args.served_model_name else None)
    sock = bind_socket(args.host, args.port)
    from glowlm.engine.llm_engine import LLMEngine
    from glowlm.entrypoints.openai.engine_loop import engine_thread

    # The engine is built, bound and stepped on one thread, so weights, KV cache and
    # OpenMP threads all follow that thread's binding.
    executor = engine_thread()
    try:
        logger.info(executor.submit(apply_thread_binding).result())
        engine = executor.submit(LLMEngine, config).result()
    except KeyboardInterrupt:
        logger.warning("interrupted while loading the model; exiting")
        os._exit(130)  # the engine thread cannot be interrupted; do not wait for it
    names = args.served_model_name or [name]
    options = ServerOptions(served_model_names=names, api_keys=api_keys, limits=http_limits,
                            chat_template=chat_template, max_queue=args.max_queue)
    serve(engine, options, sock, executor=executor,
          graceful_shutdown_timeout=args.graceful_shutdown_timeout,
          access_log=not args.disable_access_log)
    return 0
