"""The offline pooling API: ``LLM.embed``, ``LLM.classify``, ``LLM.score``, ``LLM.encode``.

As vLLM's: ``LLM(model, runner="pooling")`` (or ``auto`` for an architecture that only
pools) builds a :class:`~glowlm.engine.pooling_engine.PoolingEngine`;
``embed(prompts)`` returns ``EmbeddingRequestOutput`` with ``.outputs.embedding``,
``classify`` ``.outputs.probs``, ``score(text_1, text_2)`` ``.outputs.score`` (a
cross-encoder's relevance, or the cosine of two embeddings for an embedding model).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from tqdm import tqdm

from glowlm.engine.pooling_engine import PoolingEngine
from glowlm.engine.pooling_outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingParams,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from glowlm.errors import RequestError

PoolingPrompt = str | list[int] | dict[str, Any]


def score_pairs(text_1: Any, text_2: Any) -> list[tuple[Any, Any]]:
    """vLLM's pairing: one ``text_1`` against every ``text_2``, or two equal-length lists."""
    one = isinstance(text_1, str | dict)
    firsts = [text_1] if one else list(text_1)
    seconds = [text_2] if isinstance(text_2, str | dict) else list(text_2)
    if not firsts or not seconds:
        raise RequestError("score needs at least one text on each side")
    if len(firsts) == 1:
        return [(firsts[0], t) for t in seconds]
    if len(firsts) != len(seconds):
        raise RequestError(f"text_1 has {len(firsts)} items and text_2 {len(seconds)}: give "
                           "one text_1 or as many as text_2")
    return list(zip(firsts, seconds, strict=True))


def as_prompt_list(prompts: Any) -> list[Any]:
    """One prompt (text, a list of token ids, a dict) or a sequence of them, as a list:
    the offline API's calls all take either."""
    if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


class PoolingAPI:
    """Mixed into :class:`~glowlm.entrypoints.llm.LLM`; ``self.engine`` pools."""

    engine: Any
    _counter: int

    def _pooling_engine(self) -> PoolingEngine:
        if not isinstance(self.engine, PoolingEngine):
            raise RequestError("this model runs the generation runner; build the LLM with "
                               "runner='pooling' to embed, classify or score")
        return self.engine

    def _pool(self, prompts: PoolingPrompt | Sequence[PoolingPrompt], params: PoolingParams,
              use_tqdm: bool) -> list[PoolingRequestOutput]:
        engine = self._pooling_engine()
        prompts = as_prompt_list(prompts)
        ids: list[str] = []
        try:
            for prompt in prompts:  # type: ignore[union-attr]
                self._counter += 1
                rid = str(self._counter)
                engine.add_request(rid, prompt, params)
                ids.append(rid)
        except Exception:
            for rid in ids:  # all or nothing
                engine.abort_request(rid)
            raise
        done: dict[str, PoolingRequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Pooling", unit="req", file=sys.stderr,
                   disable=not use_tqdm, leave=False)
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    done[out.request_id] = out
                    bar.update(1)
        except BaseException:
            for rid in ids:
                engine.abort_request(rid)
            raise
        finally:
            bar.close()
        return [done[rid] for rid in ids]

    def encode(self, prompts: PoolingPrompt | Sequence[PoolingPrompt],
               pooling_params: PoolingParams | None = None, use_tqdm: bool = True,
               truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """Raw pooled tensors (``outputs.data``); ``task='encode'`` gives every token's."""
        params = pooling_params or PoolingParams()
        if truncate_prompt_tokens is not None:
            params.truncate_prompt_tokens = truncate_prompt_tokens
        return self._pool(prompts, params, use_tqdm)

    def embed(self, prompts: PoolingPrompt | Sequence[PoolingPrompt], use_tqdm: bool = True,
              pooling_params: PoolingParams | None = None,
              truncate_prompt_tokens: int | None = None) -> list[EmbeddingRequestOutput]:
        """One vector per prompt (normalized as the model says; ``dimensions`` truncates)."""
        p = pooling_params or PoolingParams()
        params = PoolingParams("embed", p.dimensions, p.normalize, p.activation,
                               truncate_prompt_tokens if truncate_prompt_tokens is not None
                               else p.truncate_prompt_tokens)
        return [EmbeddingRequestOutput.from_base(o)
                for o in self._pool(prompts, params, use_tqdm)]

    def classify(self, prompts: PoolingPrompt | Sequence[PoolingPrompt], use_tqdm: bool = True,
                 pooling_params: PoolingParams | None = None,
                 truncate_prompt_tokens: int | None = None
                 ) -> list[ClassificationRequestOutput]:
        """Label probabilities per prompt (softmax; sigmoid for a one-label head)."""
        p = pooling_params or PoolingParams()
        params = PoolingParams("classify", None, None, p.activation,
                               truncate_prompt_tokens if truncate_prompt_tokens is not None
                               else p.truncate_prompt_tokens)
        return [ClassificationRequestOutput.from_base(o)
                for o in self._pool(prompts, params, use_tqdm)]

    def score(self, text_1: str | Sequence[str], text_2: str | Sequence[str],
              use_tqdm: bool = True, truncate_prompt_tokens: int | None = None,
              pooling_params: PoolingParams | None = None) -> list[ScoringRequestOutput]:
        """Relevance of each (text_1, text_2) pair: a cross-encoder reads both texts at
        once (sigmoid of its one logit); an embedding model gives their embeddings' cosine."""
        engine = self._pooling_engine()
        pairs = score_pairs(text_1, text_2)
        p = pooling_params or PoolingParams()
        trunc = truncate_prompt_tokens if truncate_prompt_tokens is not None \
            else p.truncate_prompt_tokens
        if engine.num_labels:
            params = PoolingParams("score", None, None, p.activation, trunc)
            prompts = [{"prompt": a, "text_pair": b} for a, b in pairs]
            outs = self._pool(prompts, params, use_tqdm)
            return [ScoringRequestOutput.make(o, o.outputs.data.reshape(-1)[0].item())
                    for o in outs]
        params = PoolingParams("embed", None, True, None, trunc)
        firsts = self._pool([a for a, _ in pairs], params, use_tqdm)
        seconds = self._pool([b for _, b in pairs], params, use_tqdm)
        return [ScoringRequestOutput.make(a, torch.nn.functional.cosine_similarity(
                    a.outputs.data, b.outputs.data, dim=0).item())
                for a, b in zip(firsts, seconds, strict=True)]
