"""The prompts of ``glowlm bench serve``: its ``random``, ``sharegpt`` and
``prefix-repetition`` datasets (vLLM's names; the CLI's docstring says how each is
drawn). Text is turned into token counts, and token ids into chat text, through the
server's own ``/tokenize`` and ``/detokenize``.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glowlm.errors import ConfigError


def _lengths(mean: int, ratio: float, count: int, rng: random.Random) -> list[int]:
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(count)]


@dataclass
class Prompt:
    ids: list[int] | None       # token ids (completions); None for text-only prompts
    text: str | None            # text (chat, ShareGPT)
    prompt_len: int
    output_len: int


def load_sharegpt(path: str, count: int, rng: random.Random) -> list[tuple[str, str]]:
    """(first human turn, first reply) pairs from a ShareGPT-format JSON file, shuffled."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--dataset-path {path}: cannot read it as JSON ({exc})") from None
    pairs = []
    for item in data if isinstance(data, list) else []:
        conv = item.get("conversations") or item.get("conversation") or []
        if len(conv) >= 2 and isinstance(conv[0], dict) and isinstance(conv[1], dict):
            human, reply = conv[0].get("value"), conv[1].get("value")
            if isinstance(human, str) and isinstance(reply, str) and human and reply:
                pairs.append((human, reply))
    if not pairs:
        raise ConfigError(f"--dataset-path {path}: no conversation with two turns (ShareGPT "
                          "format: [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, "
                          "{\"from\": \"gpt\", \"value\": ...}]}])")
    rng.shuffle(pairs)
    return pairs


async def build_prompts(args: argparse.Namespace, client: Any, base: str, vocab: int,
                        rng: random.Random, chat: bool) -> list[Prompt]:
    """The dataset's prompts; text is fetched through the server's /tokenize, /detokenize."""
    n = args.num_prompts + args.num_warmups

    async def tokens(text: str) -> list[int]:
        r = await client.post(f"{base}/tokenize", json={"prompt": text,
                                                         "add_special_tokens": False})
        if r.status_code != 200:
            raise ConfigError(f"{base}/tokenize answered HTTP {r.status_code}: the sharegpt "
                              "dataset needs it to count tokens")
        return list(r.json()["tokens"])

    async def text_of(ids: list[int]) -> str:
        r = await client.post(f"{base}/detokenize", json={"tokens": ids})
        if r.status_code != 200:
            raise ConfigError(f"{base}/detokenize answered HTTP {r.status_code}: chat prompts "
                              "of token ids need it")
        return str(r.json()["prompt"])

    out: list[Prompt] = []
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise ConfigError("--dataset-name sharegpt needs --dataset-path FILE")
        for human, reply in load_sharegpt(args.dataset_path, n, rng):
            if len(out) == n:
                break
            ids = await tokens(human)
            out_len = args.sharegpt_output_len or len(await tokens(reply))
            if len(ids) < 4 or out_len < 4:  # vLLM's filter: too short to time
                continue
            out.append(Prompt(None, human, len(ids), out_len))
        if len(out) < n:
            raise ConfigError(f"--dataset-path has {len(out)} usable conversations; "
                              f"{n} needed (--num-prompts + --num-warmups)")
        return out
    if args.dataset_name == "prefix-repetition":
        k = max(1, args.prefix_repetition_num_prefixes)
        prefixes = [[rng.randrange(3, vocab) for _ in range(args.prefix_repetition_prefix_len)]
                    for _ in range(k)]
        for i in range(n):
            ids = prefixes[i % k] + [rng.randrange(3, vocab)
                                     for _ in range(args.prefix_repetition_suffix_len)]
            out.append(Prompt(ids, None, len(ids), args.prefix_repetition_output_len))
        rng.shuffle(out)
    else:
        in_lens = _lengths(args.random_input_len, args.random_range_ratio, n, rng)
        out_lens = _lengths(args.random_output_len, args.random_range_ratio, n, rng)
        for a, b in zip(in_lens, out_lens, strict=True):
            out.append(Prompt([rng.randrange(3, vocab) for _ in range(a)], None, a, b))
    if chat:
        for p in out:
            assert p.ids is not None
            p.text = await text_of(p.ids)
    return out
