"""``glowlm chat`` and ``glowlm complete``: small clients for a running server, as vLLM's.

Both talk to an OpenAI-compatible server (``glowlm serve``, or any other)
through the official ``openai`` client. The model defaults to the first one
``/v1/models`` lists. ``-q/--quick TEXT`` sends one message and exits;
otherwise they read lines from stdin until EOF (Ctrl-D) and stream each answer.
``chat`` keeps the conversation; ``complete`` sends each line as a prompt.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from glowlm.errors import ConfigError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://localhost:8000/v1",
                   help="the server's OpenAI API base (default http://localhost:8000/v1)")
    p.add_argument("--model-name", help="model to use (default: the first /v1/models lists)")
    p.add_argument("--api-key", help="API key (default: OPENAI_API_KEY, else none)")
    p.add_argument("--max-tokens", type=int, help="most tokens per answer")
    p.add_argument("-q", "--quick", metavar="TEXT",
                   help="send TEXT, print the answer and exit")


def register(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser("chat", help="chat with a running server",
                              description=__doc__.split("\n\n")[1])
    _common(c)
    c.add_argument("--system-prompt", help="a system message that starts the conversation")
    c.set_defaults(func=run_chat)
    p = subparsers.add_parser("complete", help="text completions from a running server",
                              description=__doc__.split("\n\n")[1])
    _common(p)
    p.set_defaults(func=run_complete)


def _client(args: argparse.Namespace) -> tuple[Any, str]:
    import openai

    key = args.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.OpenAI(base_url=args.url, api_key=key, max_retries=0)
    try:
        model = args.model_name or client.models.list().data[0].id
    except openai.APIConnectionError:
        raise ConfigError(f"no server answers at {args.url} (start one with glowlm "
                          "serve, or pass --url)") from None
    except openai.APIStatusError as exc:
        raise ConfigError(f"{args.url}: {exc.status_code} {exc.message}") from None
    return client, model


def _lines(quick: str | None) -> Any:
    if quick is not None:
        yield quick
        return
    while True:
        try:
            line = input("> ")
        except EOFError:
            return
        if line.strip():
            yield line


def _extra(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_tokens": args.max_tokens} if args.max_tokens is not None else {}


def run_chat(args: argparse.Namespace) -> int:
    import openai

    client, model = _client(args)
    messages: list[dict[str, str]] = []
    if args.system_prompt:
        messages.append({"role": "system", "content": args.system_prompt})
    for line in _lines(args.quick):
        messages.append({"role": "user", "content": line})
        try:
            stream = client.chat.completions.create(model=model, messages=messages,
                                                    stream=True, **_extra(args))
            answer = ""
            for chunk in stream:
                piece = chunk.choices[0].delta.content if chunk.choices else None
                if piece:
                    answer += piece
                    print(piece, end="", flush=True)
        except openai.APIError as exc:
            raise ConfigError(f"the server refused the request: {exc}") from None
        print()
        messages.append({"role": "assistant", "content": answer})
    return 0


def run_complete(args: argparse.Namespace) -> int:
    import openai

    client, model = _client(args)
    for line in _lines(args.quick):
        try:
            for chunk in client.completions.create(model=model, prompt=line, stream=True,
                                                   **_extra(args)):
                if chunk.choices:
                    print(chunk.choices[0].text, end="", flush=True)
        except openai.APIError as exc:
            raise ConfigError(f"the server refused the request: {exc}") from None
        print()
    sys.stdout.flush()
    return 0
