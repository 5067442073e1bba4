"""A causal LM scored by its own tokens: vLLM's ``--hf-overrides`` with
``classifier_from_token`` (the original Qwen3-Reranker: ``["no", "yes"]``).

The reference is what the reranker's model card computes with transformers: the LM's
last-position logits of the two tokens, softmaxed, the second's probability. glowlm's
one-label score head ``W[yes] - W[no]`` gives its sigmoid; fp32 agrees to ~1e-6, so
1e-5 is the tolerance. Three tokens make three labels (their logits' softmax).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from glowlm.entrypoints.llm import LLM
from glowlm.errors import ConfigError
from glowlm.testing.tiny_models import make_tiny_model

TEXTS = ["def fibonacci(n):", "a", "class Greeter: return f", "the cat is on the tree"]


def _tokens(path: Path, n: int) -> tuple[list[str], list[int]]:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = [40 + 7 * i for i in range(n)]
    return tok.convert_ids_to_tokens(ids), ids


def _reference(path: Path, ids: list[int]) -> torch.Tensor:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for text in TEXTS:
            logits = model(**tok(text, return_tensors="pt")).logits[0, -1, ids]
            out.append(torch.softmax(logits, -1))
    return torch.stack(out)


def _overrides(tokens: list[str]) -> dict:
    return {"architectures": ["Qwen3ForSequenceClassification"],
            "classifier_from_token": tokens, "is_original_qwen3_reranker": True}


@pytest.mark.parametrize("tied", [True, False], ids=["tied-embeddings", "lm-head"])
def test_yes_no_reranker_matches_the_lm(tmp_path: Path, tied: bool) -> None:
    path = make_tiny_model("qwen3", tmp_path / "qwen3", tie_word_embeddings=tied)
    tokens, ids = _tokens(path, 2)
    want = _reference(path, ids)[:, 1]
    llm = LLM(str(path), runner="pooling", hf_overrides=_overrides(tokens), dtype="float32",
              show_progress=False)
    got = torch.tensor([o.outputs.probs[0] for o in llm.classify(TEXTS, use_tqdm=False)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_three_tokens_are_three_labels(tmp_path: Path) -> None:
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    tokens, ids = _tokens(path, 3)
    llm = LLM(str(path), runner="pooling", hf_overrides=_overrides(tokens), dtype="float32",
              show_progress=False)
    got = torch.tensor([o.outputs.probs for o in llm.classify(TEXTS, use_tqdm=False)])
    torch.testing.assert_close(got, _reference(path, ids), atol=1e-5, rtol=1e-5)


def test_refusals(tmp_path: Path) -> None:
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    with pytest.raises(ConfigError, match="'no such token' is not a token"):
        LLM(str(path), runner="pooling", hf_overrides=_overrides(["no such token", "x"]),
            show_progress=False)
    with pytest.raises(ConfigError, match="--hf-overrides must be a JSON object"):
        LLM(str(path), hf_overrides=["x"], show_progress=False)
    with pytest.raises(ConfigError, match="--hf-overrides is not valid JSON"):
        LLM(str(path), hf_overrides="{", show_progress=False)


def test_cli_flag() -> None:
    import argparse

    from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_args(p, online=True)
    args = p.parse_args(["--hf-overrides", json.dumps(_overrides(["no", "yes"]))])
    assert engine_kwargs(args)["hf_overrides"]["classifier_from_token"] == ["no", "yes"]
