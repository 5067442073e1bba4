"""The one module that reads glowlm's environment variables.

Every ``GLOWLM_*`` variable is parsed and validated here into a frozen
:class:`Env`; the rest of the code receives values, never ``os.environ``. Bad
values raise :class:`~glowlm.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from glowlm.errors import ConfigError

T = TypeVar("T")

#: Core's own variables: name -> (default, meaning); the source of the core rows of the
#: env-var table in docs/configuration.md. A plugin's variables are its own: it declares
#: them as :class:`Setting` objects from its ``glowlm_settings`` hook, never here.
DOCUMENTED: dict[str, tuple[str, str]] = {
    "GLOWLM_PLATFORM": ("", "force a platform by name (x86, arm, zen, s390x, apple, generic, ...)"),
    "GLOWLM_PLUGINS_BLOCK": ("", "comma-separated plugin names not to import at all"),
    "GLOWLM_CPU_KVCACHE_SPACE": ("4", "KV cache size in GiB, or 'auto' (a share of free memory)"),
    "GLOWLM_CPU_OMP_THREADS_BIND": ("auto", "'auto', 'nobind', or CPU lists like 0-31|32-63"),
    "GLOWLM_CPU_NUM_OF_RESERVED_CPU": ("", "CPUs left free for the serving front-end"),
    "GLOWLM_NO_PRELOAD": ("0", "1: never re-exec with LD_PRELOAD (tcmalloc / Intel OpenMP)"),
    "GLOWLM_NO_MALLOC_TUNING": ("0", "1: leave glibc malloc's defaults (by default glowlm keeps "
                                     "freed blocks for reuse where no tcmalloc/jemalloc runs)"),
    "GLOWLM_NO_HUGE_PAGES": ("0", "1: keep weights in ordinary 4 KiB pages (no "
                                  "MADV_HUGEPAGE copy after loading)"),
    "GLOWLM_PRELOAD_APPLIED": ("", "internal: the LD_PRELOAD glowlm set when it re-executed "
                                   "itself (loop guard); do not set"),
    "GLOWLM_KERNEL_CACHE": ("~/.cache/glowlm/kernels", "where compiled kernels are cached"),
    "GLOWLM_GGUF_CACHE": ("~/.cache/glowlm/gguf", "where a GGUF file's metadata is converted "
                                                 "to config and tokenizer files (once per file)"),
    "GLOWLM_GGUF_NATIVE": ("1", "run GGUF linear weights and the LM head (Q4_0/Q4_1/Q8_0/"
                                "Q5_0/Q5_1/Q2_K-Q6_K) natively as 4/8-bit blocks where the "
                                "platform implements them (fewer bytes per token); 0: "
                                "dequantize every tensor at load"),
    "GLOWLM_GGUF_NATIVE_HEAD": ("auto", "the GGUF LM head natively too: auto (when its blocks "
                                        "run 4-bit, or 8-bit where the layers take int8 "
                                        "activations; otherwise 8-bit heads stay dense "
                                        "bf16, which streams faster), 1 (any native "
                                        "type), 0 (dense)"),
    "GLOWLM_GGUF_INT8_ACTIVATIONS": ("auto", "natively run GGUF layers multiply int8 "
                                             "activations (per 32 columns, as ggml does): "
                                             "auto (where the kernels are faster so: CPUs "
                                             "without a bf16 dot product), 1, 0 (the "
                                             "model dtype's activations)"),
    "GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS": ("auto", "weight-only layers of AWQ/GPTQ/"
                                                    "compressed-tensors checkpoints "
                                                    "(W4A16, W8A16) quantize their "
                                                    "activations to int8 per 32 columns, "
                                                    "as GGUF's do: auto (where the "
                                                    "kernels are faster so: CPUs without "
                                                    "a bf16 dot product), 1, 0 (the "
                                                    "checkpoint's own A16 arithmetic)"),
    "GLOWLM_DISABLE_KERNELS": ("0", "1: use core's reference kernels, not a plugin's "
                                    "compiled ones"),
    "GLOWLM_NO_FUSED_LAYERS": ("0", "1: run every decoder layer module by module, never as "
                                    "a platform's fused layer or stack op"),
    "GLOWLM_LINEAR_IMPL": ("", "pin one linear implementation (glowlm, torch, zentorch, ...) "
                               "for every layer that offers it; 'default': no measured "
                               "choice; empty: measure each shape at load (cached)"),
    "GLOWLM_LINEAR_CHOICE_CACHE": ("~/.cache/glowlm/linear_choice",
                                   "where the measured per-shape linear choice is cached"),
    "GLOWLM_LOG_LEVEL": ("INFO", "DEBUG, INFO, WARNING or ERROR"),
    # glowlm serve (flags of the same meaning win over these):
    "GLOWLM_API_KEY": ("", "API key the server requires when no --api-key is given"),
    "GLOWLM_MAX_REQUEST_BODY_BYTES": ("8388608", "largest request body the server reads "
                                                 "(413 past it)"),
    "GLOWLM_HTTP_HEADER_TIMEOUT": ("10", "seconds a connection may take to send a "
                                         "request's headers"),
    "GLOWLM_HTTP_BODY_TIMEOUT": ("60", "seconds a request's body may take to arrive (408)"),
    "GLOWLM_HTTP_TIMEOUT_KEEP_ALIVE": ("5", "seconds an idle keep-alive connection stays "
                                            "open"),
    "GLOWLM_HTTP_LIMIT_CONCURRENCY": ("1024", "open connections (or requests) past which new "
                                              "requests get 503"),
    "GLOWLM_ALLOW_RUNTIME_LORA_UPDATING": ("0", "1: enable /v1/load_lora_adapter and "
                                                "/v1/unload_lora_adapter (with --enable-lora; "
                                                "vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)"),
}


@dataclass(frozen=True)
class Env:
    platform: str | None
    plugins_block: frozenset[str]
    kvcache_space_gib: float | None  # None means 'auto'
    omp_threads_bind: str
    num_reserved_cpus: int | None
    no_preload: bool
    no_malloc_tuning: bool
    no_huge_pages: bool
    preload_applied: str
    kernel_cache: str
    gguf_cache: str
    gguf_native: bool
    gguf_native_head: str  # "auto", "1" or "0"
    gguf_int8_activations: str  # "auto", "1" or "0"
    weight_only_int8_activations: str  # "auto", "1" or "0"
    disable_kernels: bool
    no_fused_layers: bool
    linear_impl: str | None  # None: measure; "default": off; else a candidate name
    linear_choice_cache: str
    log_level: str


def _bool(name: str, raw: str) -> bool:
    if raw.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if raw.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use 1 or 0")


def _head(raw: str, name: str = "GLOWLM_GGUF_NATIVE_HEAD") -> str:
    value = raw.strip().lower() or "auto"
    if value not in ("auto", "1", "0"):
        raise ConfigError(f"{name}={raw!r}: use auto, 1 or 0")
    return value


def parse(environ: Mapping[str, str]) -> Env:
    """Build an :class:`Env` from a mapping (``os.environ`` or a test's dict)."""

    def raw(name: str) -> str:
        return environ.get(name, DOCUMENTED[name][0])

    kv = raw("GLOWLM_CPU_KVCACHE_SPACE").strip().lower()
    if kv == "auto":
        kv_gib: float | None = None
    else:
        try:
            kv_gib = float(kv)
        except ValueError:
            raise ConfigError(
                f"GLOWLM_CPU_KVCACHE_SPACE={kv!r} is not a number of GiB or 'auto'"
            ) from None
        if kv_gib <= 0:
            raise ConfigError(f"GLOWLM_CPU_KVCACHE_SPACE must be > 0 GiB, got {kv_gib}")
    reserved_raw = raw("GLOWLM_CPU_NUM_OF_RESERVED_CPU").strip()
    reserved: int | None = None
    if reserved_raw:
        if not reserved_raw.isdigit():
            raise ConfigError(
                f"GLOWLM_CPU_NUM_OF_RESERVED_CPU={reserved_raw!r} is not a non-negative integer"
            )
        reserved = int(reserved_raw)
    level = raw("GLOWLM_LOG_LEVEL").strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"GLOWLM_LOG_LEVEL={level!r}; use DEBUG, INFO, WARNING or ERROR")
    bind = raw("GLOWLM_CPU_OMP_THREADS_BIND").strip() or "auto"
    platform = raw("GLOWLM_PLATFORM").strip().lower() or None
    block = frozenset(
        p.strip().lower() for p in raw("GLOWLM_PLUGINS_BLOCK").split(",") if p.strip()
    )
    return Env(
        platform=platform,
        plugins_block=block,
        kvcache_space_gib=kv_gib,
        omp_threads_bind=bind,
        num_reserved_cpus=reserved,
        no_preload=_bool("GLOWLM_NO_PRELOAD", raw("GLOWLM_NO_PRELOAD")),
        no_malloc_tuning=_bool("GLOWLM_NO_MALLOC_TUNING", raw("GLOWLM_NO_MALLOC_TUNING")),
        no_huge_pages=_bool("GLOWLM_NO_HUGE_PAGES", raw("GLOWLM_NO_HUGE_PAGES")),
        preload_applied=raw("GLOWLM_PRELOAD_APPLIED").strip(),
        kernel_cache=os.path.expanduser(raw("GLOWLM_KERNEL_CACHE")),
        gguf_cache=os.path.expanduser(raw("GLOWLM_GGUF_CACHE")),
        gguf_native=_bool("GLOWLM_GGUF_NATIVE", raw("GLOWLM_GGUF_NATIVE")),
        gguf_native_head=_head(raw("GLOWLM_GGUF_NATIVE_HEAD")),
        gguf_int8_activations=_head(raw("GLOWLM_GGUF_INT8_ACTIVATIONS"),
                                    "GLOWLM_GGUF_INT8_ACTIVATIONS"),
        weight_only_int8_activations=_head(raw("GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS"),
                                           "GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS"),
        disable_kernels=_bool("GLOWLM_DISABLE_KERNELS", raw("GLOWLM_DISABLE_KERNELS")),
        no_fused_layers=_bool("GLOWLM_NO_FUSED_LAYERS", raw("GLOWLM_NO_FUSED_LAYERS")),
        linear_impl=raw("GLOWLM_LINEAR_IMPL").strip().lower() or None,
        linear_choice_cache=os.path.expanduser(raw("GLOWLM_LINEAR_CHOICE_CACHE")),
        log_level=level,
    )


def parse_bool(name: str, raw: str) -> bool:
    """A :class:`Setting` parser: ``1/true/yes/on`` or ``0/false/no/off/''``."""
    return _bool(name, raw)


def parse_str(name: str, raw: str) -> str | None:
    """A :class:`Setting` parser: the stripped, lower-cased text, ``None`` when empty."""
    return raw.strip().lower() or None


def parse_int(name: str, raw: str) -> int:
    """A :class:`Setting` parser: a (signed) integer."""
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def parse_choice(*choices: str) -> Callable[[str, str], str | None]:
    """A :class:`Setting` parser accepting one of ``choices`` (case-insensitive) or empty."""

    def parse(name: str, raw: str) -> str | None:
        value = raw.strip().lower() or None
        if value is not None and value not in choices:
            raise ConfigError(f"{name}={raw!r}; use one of {', '.join(choices)}")
        return value

    return parse


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable a plugin owns: its name, default, meaning and parser.

    A plugin declares its settings as module-level ``Setting`` objects, returns them
    from its ``glowlm_settings`` hook (so ``glowlm collect-env``, ``glowlm platforms``
    and the docs list them beside core's), and reads them with :meth:`get` where it
    used to read ``os.environ``. ``parse(name, raw)`` turns the text (the default
    when unset) into the value and raises :class:`~glowlm.errors.ConfigError` naming
    the variable when the text is bad.
    """

    name: str
    default: str
    help: str
    parse: Callable[[str, str], T]

    def raw(self, environ: Mapping[str, str] | None = None) -> str:
        env = os.environ if environ is None else environ
        return env.get(self.name, self.default)

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The parsed value from ``environ`` (default: the process environment, read now)."""
        return self.parse(self.name, self.raw(environ))


def get() -> Env:
    """The current process environment, parsed fresh (cheap; keeps tests honest)."""
    return parse(os.environ)


@dataclass(frozen=True)
class BenchSuiteEnv:
    """Selectors of the serving benchmark suite (names fixed by the spec, no prefix)."""

    dry_run: bool
    model_filter: str | None
    dtype_filter: str | None
    serving_json: str | None


def bench_suite(environ: Mapping[str, str] | None = None) -> BenchSuiteEnv:
    env = os.environ if environ is None else environ
    return BenchSuiteEnv(
        dry_run=_bool("DRY_RUN", env.get("DRY_RUN", "0")),
        model_filter=env.get("MODEL_FILTER") or None,
        dtype_filter=env.get("DTYPE_FILTER") or None,
        serving_json=env.get("SERVING_JSON") or None,
    )


@dataclass(frozen=True)
class ServerEnv:
    """``glowlm serve``'s variables: defaults for the flags of the same meaning."""

    api_key: str | None
    max_request_body_bytes: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    limit_concurrency: int
    #: /v1/load_lora_adapter and /v1/unload_lora_adapter answer (off: 404), as vLLM's
    #: VLLM_ALLOW_RUNTIME_LORA_UPDATING: loading files named by a client is opt-in.
    allow_runtime_lora_updating: bool = False


def server(environ: Mapping[str, str] | None = None) -> ServerEnv:
    env = os.environ if environ is None else environ

    def raw(name: str) -> str:
        return env.get(name, DOCUMENTED[name][0]).strip()

    def positive(name: str, kind: type[int] | type[float]) -> float:
        try:
            value = kind(raw(name))
        except ValueError:
            raise ConfigError(f"{name}={raw(name)!r} is not a number") from None
        if value <= 0:
            raise ConfigError(f"{name} must be > 0, got {value}")
        return value

    return ServerEnv(
        api_key=raw("GLOWLM_API_KEY") or None,
        max_request_body_bytes=int(positive("GLOWLM_MAX_REQUEST_BODY_BYTES", int)),
        header_timeout=positive("GLOWLM_HTTP_HEADER_TIMEOUT", float),
        body_timeout=positive("GLOWLM_HTTP_BODY_TIMEOUT", float),
        keep_alive_timeout=positive("GLOWLM_HTTP_TIMEOUT_KEEP_ALIVE", float),
        limit_concurrency=int(positive("GLOWLM_HTTP_LIMIT_CONCURRENCY", int)),
        allow_runtime_lora_updating=_bool("GLOWLM_ALLOW_RUNTIME_LORA_UPDATING",
                                          raw("GLOWLM_ALLOW_RUNTIME_LORA_UPDATING")),
    )


@dataclass(frozen=True)
class HubEnv:
    """The Hugging Face Hub variables glowlm honours, read at call time.

    huggingface_hub reads these once, when it is first imported; glowlm reads them
    whenever a model is resolved and hands them to it explicitly (``endpoint=``,
    ``cache_dir=``, ``local_files_only=``), so an ``LLM(...)`` in a long-lived process
    and a test's environment both mean what they say. ``HF_TOKEN`` is left to
    huggingface_hub, which also finds the token ``hf auth login`` saved.
    """

    endpoint: str      # HF_ENDPOINT: the Hub or a mirror
    offline: bool      # HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE): the cache only
    cache_dir: str     # HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    progress_bars: bool  # not HF_HUB_DISABLE_PROGRESS_BARS


def hub(environ: Mapping[str, str] | None = None) -> HubEnv:
    env = os.environ if environ is None else environ

    def flag(*names: str) -> bool:
        for name in names:
            raw = env.get(name, "").strip()
            if raw:
                return _bool(name, raw)
        return False

    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache",
                                                  "huggingface")
        cache = os.path.join(home, "hub")
    return HubEnv(
        endpoint=(env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/"),
        offline=flag("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
        cache_dir=os.path.expanduser(cache),
        progress_bars=not flag("HF_HUB_DISABLE_PROGRESS_BARS"),
    )
