"""``glowlm serve [MODEL]``: the OpenAI-compatible server, with the online engine defaults.

Start-up order: bind the port (a busy port fails at once), apply the thread
binding on the engine thread, build the engine on that same thread (it logs the
platform and why, the dtype and the KV cache in blocks and tokens), then serve.
Heavy imports happen inside ``run`` so ``glowlm --help`` stays fast. What each flag
resolves to (keys and HTTP limits, chat template, generation defaults, the model) is
:mod:`~glowlm.entrypoints.cli.serve_settings`'s.

The flags are ``vllm serve``'s, so a copied command line starts: the ones that
mean nothing on a CPU engine (GPU memory, CUDA graphs, custom all-reduce...)
are accepted with one warning each saying why they are ignored.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from pathlib import Path
from typing import Any

from glowlm import envs
from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs
from glowlm.entrypoints.cli.serve_settings import (
    generation_defaults,
    http_settings,
    read_chat_template,
    resolve_model,
)
from glowlm.errors import ConfigError, GlowlmError, LoRAError
from glowlm.logger import init_logger

logger = init_logger(__name__)

#: vLLM serve flags that mean nothing on a CPU engine: flag -> (nargs, why ignored).
IGNORED_FLAGS: dict[str, tuple[int | str, str]] = {
    "--gpu-memory-utilization": (1, "the KV cache size is GLOWLM_CPU_KVCACHE_SPACE (GiB)"),
    "--enforce-eager": (0, "there are no CUDA graphs on CPU"),
    "--max-seq-len-to-capture": (1, "there are no CUDA graphs on CPU"),
    "--cuda-graph-sizes": ("*", "there are no CUDA graphs on CPU"),
    "--compilation-config": (1, "glowlm does not use torch.compile"),
    "--swap-space": (1, "the KV cache already lives in host memory"),
    "--cpu-offload-gb": (1, "the weights already live in host memory"),
    "--disable-custom-all-reduce": (0, "custom all-reduce is a GPU kernel"),
    "--num-gpu-blocks-override": (1, "there is no GPU KV cache"),
    "--enable-chunked-prefill": (0, "glowlm always chunks long prefills"),
    "--no-enable-chunked-prefill": (0, "glowlm always chunks long prefills"),
    "--disable-frontend-multiprocessing": (0, "the engine runs in the server process"),
    "--distributed-executor-backend": (1, "glowlm runs its own ranks"),
    "--load-format": (1, "glowlm reads safetensors (and *.bin with --allow-pickle)"),
    "--download-dir": (1, "downloads go to the Hugging Face cache: set HF_HUB_CACHE or "
                          "HF_HOME to move it"),
    "--tokenizer-mode": (1, "glowlm uses the Hugging Face fast tokenizer"),
    "--disable-log-requests": (0, "glowlm does not log request contents"),
    "--enable-log-requests": (0, "glowlm does not log request contents"),
    "--async-scheduling": (0, "the engine thread already overlaps steps with the front-end"),
}


class _Ignored(argparse.Action):
    """Accept a vLLM flag that means nothing here; ``run`` warns once per flag."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        seen = getattr(namespace, "ignored_flags", None) or []
        if option_string and option_string not in seen:
            seen.append(option_string)
        namespace.ignored_flags = seen


def _json_list(text: str) -> list[str]:
    """vLLM passes CORS lists as JSON (``'["http://a"]'``); a bare value is a one-item list."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return [text]
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a JSON list of strings")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (a Hugging Face model directory, a .gguf file or an "
                    "ORG/NAME[:QUANT] id of the Hugging Face Hub, downloaded into its cache "
                    "when missing; default: SmolLM2-135M-Instruct) "
                    "with the OpenAI API: /v1/completions, /v1/chat/completions, "
                    "/v1/models (with --runner pooling: /v1/embeddings, /score, /rerank, "
                    "/classify, /pooling), plus /health, /metrics, /tokenize, /detokenize, "
                    "/version; with --enable-lora, LoRA adapters by name (--lora-modules) "
                    "and, with GLOWLM_ALLOW_RUNTIME_LORA_UPDATING=1, /v1/load_lora_adapter "
                    "and /v1/unload_lora_adapter. "
                    "Environment: GLOWLM_CPU_KVCACHE_SPACE (KV cache GiB), "
                    "GLOWLM_CPU_OMP_THREADS_BIND, GLOWLM_CPU_NUM_OF_RESERVED_CPU, "
                    "GLOWLM_PLATFORM; HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HOME for the Hub.")
    p.add_argument("model", nargs="?", default=None,
                   help="model directory, .gguf file or Hub id ORG/NAME[:QUANT] (default: "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("--model", dest="model_option", metavar="MODEL",
                   help="the model, as vLLM's --model (instead of the positional)")
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
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                   help="sampling defaults for fields a request leaves out: 'auto' (the "
                        "model's generation_config.json), 'vllm' (none: OpenAI's defaults), "
                        "or a directory holding a generation_config.json (default auto)")
    p.add_argument("--max-logprobs", type=int, default=20, metavar="N",
                   help="most logprobs / top_logprobs / prompt_logprobs a request may ask "
                        "for; -1: the vocabulary size (default 20)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="let the model decide to call tools (tool_choice 'auto'); needs "
                        "--tool-call-parser")
    p.add_argument("--tool-call-parser", metavar="NAME",
                   help="how tool calls are read from the model's text: hermes, llama3_json, "
                        "mistral, qwen3_xml, qwen3_coder ...")
    p.add_argument("--max-queue", type=int, metavar="N",
                   help="at most N requests wait for a slot; more get 503 with Retry-After "
                        "(default: unlimited)")
    p.add_argument("--graceful-shutdown-timeout", "--shutdown-timeout", type=float,
                   default=30.0, metavar="S", dest="graceful_shutdown_timeout",
                   help="on Ctrl-C/SIGTERM, let open requests finish for up to S seconds, "
                        "then abort them (default 30)")
    p.add_argument("--disable-access-log", "--disable-uvicorn-access-log",
                   action="store_true", dest="disable_access_log",
                   help="do not log one line per HTTP request")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic 'Avg prompt throughput' log line")
    p.add_argument("--headless", action="store_true",
                   help="run no API server: this host's ranks of a group whose driver runs "
                        "on host 0 (with --nnodes N --node-rank 1..N-1; docs/parallelism.md)")
    http = p.add_argument_group("HTTP (uvicorn)")
    http.add_argument("--uvicorn-log-level", default="info",
                      choices=("critical", "error", "warning", "info", "debug", "trace"),
                      help="uvicorn's log level (default info)")
    http.add_argument("--root-path", default="",
                      help="path prefix under which a proxy serves the API (ASGI root_path)")
    http.add_argument("--ssl-keyfile", metavar="FILE", help="TLS private key (PEM)")
    http.add_argument("--ssl-certfile", metavar="FILE", help="TLS certificate (PEM)")
    http.add_argument("--ssl-ca-certs", metavar="FILE",
                      help="CA certificates for verifying client certificates")
    http.add_argument("--ssl-cert-reqs", type=int, default=0,
                      help="whether client certificates are required (ssl module constant)")
    http.add_argument("--allowed-origins", type=_json_list, default=["*"],
                      help="CORS origins, JSON list (default [\"*\"])")
    http.add_argument("--allowed-methods", type=_json_list, default=["*"],
                      help="CORS methods, JSON list (default [\"*\"])")
    http.add_argument("--allowed-headers", type=_json_list, default=["*"],
                      help="CORS headers, JSON list (default [\"*\"])")
    http.add_argument("--allow-credentials", action="store_true",
                      help="CORS: allow credentials")
    add_http_limit_args(p)
    add_engine_args(p, online=True)
    ignored = p.add_argument_group("vLLM flags accepted and ignored on CPU (one warning each)")
    for flag, (nargs, why) in IGNORED_FLAGS.items():
        kwargs: dict[str, Any] = {"nargs": nargs} if nargs != 1 else {}
        ignored.add_argument(flag, action=_Ignored, dest="ignored_flags", default=[],
                             help=f"ignored: {why}", **kwargs)
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


def check_lora_modules(args: argparse.Namespace, config: Any, served_names: list[str]
                       ) -> list[Any]:
    """``--lora-modules`` as LoRARequests (ids 1..n), checked before the model loads.

    Whatever can be known without the model fails here, in a second, as one line: a
    name used twice or also a served model name (a client could not tell them apart),
    -dp N > 1 (the replicas would each need the adapters; not supported yet), a path
    that is no adapter or an adapter glowlm refuses (read now, without the model; its
    shapes are checked against the model when it is registered after the load).
    """
    modules = getattr(args, "lora_modules", None) or []
    if config.enable_lora and config.data_parallel_size > 1:
        raise ConfigError(f"--enable-lora with -dp {config.data_parallel_size} is not "
                          "supported yet: serve LoRA adapters with one engine replica "
                          "(-dp 1; -tp/-pp spread it over more cores)")
    from glowlm.lora.adapter import read_adapter
    from glowlm.lora.request import from_modules

    seen: set[str] = set()
    for m in modules:
        label = f"--lora-modules {m['name']}={m['path']}"
        if m["name"] in served_names:
            raise ConfigError(f"{label}: {m['name']!r} is also a served model name; give the "
                              "adapter another name")
        if m["name"] in seen:
            raise ConfigError(f"{label}: the name {m['name']!r} is given twice")
        seen.add(m["name"])
        try:
            read_adapter(m["path"])
        except LoRAError as exc:
            raise ConfigError(f"{label}: {exc}") from None
    return from_modules(modules)


def register_lora_modules(engine: Any, modules: list[Any]) -> None:
    """Engine thread: register each ``--lora-modules`` adapter, checked against the
    model now; the first that cannot be served is a ConfigError naming its flag."""
    for request in modules:
        try:
            engine.add_lora(request)
        except LoRAError as exc:
            raise ConfigError(f"--lora-modules {request.lora_name}={request.lora_path}: "
                              f"{exc}") from None


def run(args: argparse.Namespace) -> int:
    if args.max_queue is not None and args.max_queue < 0:
        raise ConfigError("--max-queue must be >= 0")
    for flag in getattr(args, "ignored_flags", None) or []:
        logger.warning("%s is ignored: %s", flag, IGNORED_FLAGS[flag][1])
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ConfigError("TLS needs both --ssl-keyfile and --ssl-certfile")
    for flag in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = getattr(args, flag)
        if path and not Path(path).is_file():
            raise ConfigError(f"--{flag.replace('_', '-')} {path}: no such file")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser NAME")
    if args.tool_call_parser:
        from glowlm.entrypoints.openai.tool_parsers import get_tool_parser

        get_tool_parser(args.tool_call_parser)  # unknown name: fail before the model loads
    chat_template = read_chat_template(args.chat_template)
    api_keys, http_limits = http_settings(args)
    model = name = resolve_model(args)
    if model is None:
        from glowlm import default_model

        model, name = default_model.default_model_path(), str(default_model.describe()["name"])
        logger.info("no MODEL given: serving the default model %s (%s)", name, model)
    from glowlm.config import EngineConfig
    from glowlm.entrypoints.openai.server import ServerOptions, bind_socket, serve
    from glowlm.model_loader.hub import fetch_model
    from glowlm.model_loader.resolve import resolve_model as find_model

    config = EngineConfig.create(
        str(model), online=True, **engine_kwargs(args),
        served_model_name=args.served_model_name[0] if args.served_model_name else None)
    config = fetch_model(config)  # an ORG/NAME not in the cache: downloaded, pinned
    # The model's own directory (a GGUF file's converted metadata, a cached snapshot).
    model_dir = find_model(config.model, config.revision, config.gguf_file).path
    defaults = generation_defaults(args.generation_config, str(model_dir))
    names = args.served_model_name or [str(name)]
    lora_modules = check_lora_modules(args, config, names)
    allow_lora_updates = envs.server().allow_runtime_lora_updating
    if args.headless or config.node_rank > 0:
        from glowlm.executor.node import run_headless

        if not args.headless:
            raise ConfigError(f"--node-rank {config.node_rank}: that host runs no API server; "
                              "add --headless (as vLLM)")
        return run_headless(config)
    sock = bind_socket(args.host, args.port)
    from glowlm.engine.llm_engine import LLMEngine
    from glowlm.entrypoints.openai.engine_loop import engine_thread

    # The engine is built, bound and stepped on one thread, so weights, KV cache and
    # OpenMP threads all follow that thread's binding.
    executor = engine_thread()
    try:
        logger.info(executor.submit(apply_thread_binding).result())
        from glowlm.engine.pooling_engine import PoolingEngine, runner_for

        if runner_for(config) == "pooling":  # embeddings, scores: docs/pooling.md
            engine = executor.submit(PoolingEngine, config).result()
        elif config.data_parallel_size > 1:  # replicas in their own processes
            from glowlm.executor.dp import DPEngine

            engine = executor.submit(DPEngine, config).result()
        else:
            from glowlm.executor import start_ranks

            engine = executor.submit(LLMEngine, config, ranks=start_ranks).result()
    except KeyboardInterrupt:
        logger.warning("interrupted while loading the model; exiting")
        os._exit(130)  # the engine thread cannot be interrupted; do not wait for it
    if lora_modules:
        try:
            executor.submit(register_lora_modules, engine, lora_modules).result()
        except GlowlmError:
            executor.submit(engine.shutdown).result()  # TP/PP ranks: stopped, not orphaned
            executor.shutdown()
            raise
    if allow_lora_updates:
        logger.warning("GLOWLM_ALLOW_RUNTIME_LORA_UPDATING=1: clients may load LoRA adapters "
                       "from any path this server can read (/v1/load_lora_adapter)%s",
                       "" if config.enable_lora else
                       "; without --enable-lora those routes refuse every request")
    options = ServerOptions(
        served_model_names=names, chat_template=chat_template,
        api_keys=api_keys, limits=http_limits,
        max_queue=args.max_queue, generation_defaults=defaults,
        max_logprobs=args.max_logprobs, enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser, allowed_origins=args.allowed_origins,
        allowed_methods=args.allowed_methods, allowed_headers=args.allowed_headers,
        allow_credentials=args.allow_credentials, log_stats=not args.disable_log_stats,
        allow_runtime_lora_updating=allow_lora_updates)
    uvicorn_options = {"log_level": args.uvicorn_log_level, "root_path": args.root_path,
                       "ssl_keyfile": args.ssl_keyfile, "ssl_certfile": args.ssl_certfile,
                       "ssl_ca_certs": args.ssl_ca_certs, "ssl_cert_reqs": args.ssl_cert_reqs}
    serve(engine, options, sock, executor=executor,
          graceful_shutdown_timeout=args.graceful_shutdown_timeout,
          access_log=not args.disable_access_log, uvicorn_options=uvicorn_options)
    return 0
