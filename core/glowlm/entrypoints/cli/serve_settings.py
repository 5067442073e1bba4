"""What ``glowlm serve`` resolves from its flags before the engine starts: the API keys
and HTTP limits (each flag, else its GLOWLM_* variable), the chat template file, the
request defaults of ``--generation-config`` (as vLLM applies them) and the model named
positionally or by ``--model``. Each problem is one :class:`~glowlm.errors.ConfigError`
naming the flag.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from glowlm.errors import ConfigError
from glowlm.logger import init_logger

logger = init_logger(__name__)


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


def read_chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--chat-template {path}: cannot read it ({exc.strerror})") from None


#: generation_config.json keys vLLM applies as request defaults, and their request names.
GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "max_new_tokens": "max_tokens"}


def generation_defaults(setting: str, model_dir: str) -> dict[str, Any]:
    """Request defaults from ``--generation-config``, as vLLM applies them.

    ``auto`` reads the model's generation_config.json, ``vllm`` uses none, any
    other value is a directory with a generation_config.json. Only sampling keys
    are taken; a request's own fields always win.
    """
    if setting == "vllm":
        return {}
    where = Path(model_dir if setting == "auto" else setting).expanduser()
    file = where / "generation_config.json"
    if not file.exists():
        if setting != "auto":
            raise ConfigError(f"--generation-config {setting}: {file} does not exist")
        return {}
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--generation-config: cannot read {file}: {exc}") from None
    out = {GENERATION_KEYS[k]: v for k, v in raw.items() if k in GENERATION_KEYS}
    if out:
        logger.info("default sampling parameters from %s (requests override them): %s",
                    file, json.dumps(out))
    return out


def resolve_model(args: argparse.Namespace) -> str | None:
    if args.model_option and args.model and args.model_option != args.model:
        raise ConfigError(f"two models given: {args.model} and --model {args.model_option}")
    return args.model or args.model_option
