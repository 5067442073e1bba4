"""The pooling routes: ``/v1/embeddings``, ``/score``, ``/rerank``, ``/classify``, ``/pooling``.

Shapes are OpenAI's for embeddings (``data[i].embedding`` as floats or base64 of
little-endian float32, ``usage``) and vLLM's for the rest; ``/rerank`` is the Jina /
Cohere shape (``results`` of ``index``, ``relevance_score``, ``document``, best first).
Inputs are tokenized on the tokenizer thread and checked before anything is queued, so
an input over the model's maximum is a 400 naming ``input`` (unless
``truncate_prompt_tokens`` is set), and the queue limit, cancellation on disconnect
and the metrics are those of the generation routes.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from glowlm.engine.pooling_engine import tokenize_input
from glowlm.engine.pooling_outputs import PoolingParams, PoolingRequestOutput
from glowlm.entrypoints.openai.errors import APIError
from glowlm.entrypoints.openai.protocol import parse_request
from glowlm.entrypoints.openai.protocol.pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from glowlm.entrypoints.openai.serving_base import OpenAIServing, now, random_id
from glowlm.errors import RequestError

_INPUT_SHAPES = ("input must be a string, a list of strings, a list of token ids, or a list "
                 "of lists of token ids")


def normalize_inputs(value: Any, param: str = "input") -> list[str | list[int]]:
    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise APIError(f"{param} is empty" if value == [] else _INPUT_SHAPES, param=param)
    if is_ids(value):
        return [value]
    if all(isinstance(p, str) for p in value) or all(is_ids(p) for p in value):
        return list(value)
    raise APIError(_INPUT_SHAPES, param=param)


def encode_vector(data: torch.Tensor, encoding_format: str) -> list[float] | str:
    """Floats, or OpenAI's base64: the float32 bytes, little-endian."""
    if encoding_format == "base64":
        return base64.b64encode(data.float().numpy().astype("<f4").tobytes()).decode()
    return data.tolist()


class OpenAIServingPooling(OpenAIServing):
    """Every pooling route; ``driver.engine`` is a PoolingEngine."""

    def _prompt(self, item: str | list[int] | tuple[str, str], truncate: int | None
                ) -> dict[str, Any]:
        """Tokenizer thread: one input as the engine's prompt dict."""
        if isinstance(item, list):
            ids, types, text = item, None, None
            if truncate is not None:
                keep = self.max_model_len if truncate == -1 else truncate
                ids = ids[-keep:]
        elif isinstance(item, tuple):
            ids, types = tokenize_input(self.driver.tokenizer, item[0], item[1], truncate,
                                        self.max_model_len)
            text = item[0]
        else:
            ids, types = tokenize_input(self.driver.tokenizer, item, None, truncate,
                                        self.max_model_len)
            text = item
        return {"prompt_token_ids": list(ids), "token_type_ids": types, "prompt": text}

    async def _run(self, raw: Request, items: list[Any], params: PoolingParams, prefix: str
                   ) -> tuple[str, list[PoolingRequestOutput]] | Response:
        """Tokenize, check, queue and wait for ``items``; outputs in input order."""
        engine = self.driver.engine
        try:
            engine.check_task(params.task or engine.task)
            engine.check_dimensions(params.dimensions, params.task or engine.task)
        except RequestError as exc:
            raise APIError(str(exc), param="dimensions" if "dimensions" in str(exc)
                           else None) from None
        for item in items:
            texts = item if isinstance(item, tuple) else (item,)
            for t in texts:
                if isinstance(t, str):
                    self.check_prompt_chars(len(t), "input")
        self.check_queue(len(items))
        prompts = await self.driver.run_tokenizer(
            lambda: [self._prompt(i, params.truncate_prompt_tokens) for i in items])
        for p in prompts:
            ids = p["prompt_token_ids"]
            if not ids:
                raise APIError("input is empty", param="input")
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise APIError(f"input: token ids must be in [0, {self.vocab_size})",
                               param="input")
            if len(ids) > self.max_model_len:
                raise APIError(f"this model's maximum input length is {self.max_model_len} "
                               f"tokens, but an input has {len(ids)} tokens; shorten it or "
                               "set truncate_prompt_tokens", param="input",
                               code="context_length_exceeded")
        request_id = random_id(prefix)
        group = self.driver.group()
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        engine_params = PoolingParams(params.task, params.dimensions, params.normalize,
                                      params.activation, None)
        try:
            for rid, prompt in zip(ids, prompts, strict=True):
                await group.add(rid, prompt, engine_params)
        except RequestError as exc:
            group.close()
            raise APIError(str(exc), param="input") from None
        except BaseException:
            group.close()
            raise
        finals = await self.collect(raw, group)
        if finals is None:
            return Response(status_code=499)
        return request_id, [finals[rid] for rid in ids]  # type: ignore[misc]

    @staticmethod
    def _usage(outs: list[PoolingRequestOutput]) -> dict[str, int]:
        n = sum(len(o.prompt_token_ids) for o in outs)
        return {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}

    async def embeddings(self, raw: Request, body: bytes) -> Response:
        req: EmbeddingRequest = parse_request(EmbeddingRequest, body)
        model = self.model_name(req.model)
        params = PoolingParams("embed", req.dimensions, req.normalize, None,
                               req.truncate_prompt_tokens)
        done = await self._run(raw, normalize_inputs(req.input), params, "embd")
        if isinstance(done, Response):
            return done
        rid, outs = done
        data = [{"index": i, "object": "embedding",
                 "embedding": encode_vector(o.outputs.data, req.encoding_format)}
                for i, o in enumerate(outs)]
        return JSONResponse({"id": rid, "object": "list", "created": now(), "model": model,
                             "data": data, "usage": self._usage(outs)})

    async def pooling(self, raw: Request, body: bytes) -> Response:
        req: PoolingRequest = parse_request(PoolingRequest, body)
        model = self.model_name(req.model)
        params = PoolingParams(req.task, None, req.normalize, None, req.truncate_prompt_tokens)
        done = await self._run(raw, normalize_inputs(req.input), params, "pool")
        if isinstance(done, Response):
            return done
        rid, outs = done
        data = [{"index": i, "object": "pooling",
                 "data": encode_vector(o.outputs.data, req.encoding_format)}
                for i, o in enumerate(outs)]
        return JSONResponse({"id": rid, "object": "list", "created": now(), "model": model,
                             "data": data, "usage": self._usage(outs)})

    async def classify(self, raw: Request, body: bytes) -> Response:
        req: ClassificationRequest = parse_request(ClassificationRequest, body)
        model = self.model_name(req.model)
        params = PoolingParams("classify", None, None, req.activation,
                               req.truncate_prompt_tokens)
        done = await self._run(raw, normalize_inputs(req.input), params, "classify")
        if isinstance(done, Response):
            return done
        rid, outs = done
        labels = self.driver.engine.id2label
        data = []
        for i, o in enumerate(outs):
            probs = o.outputs.data.tolist()
            best = int(np.argmax(probs))
            data.append({"index": i, "label": labels.get(best, str(best)), "probs": probs,
                         "num_classes": len(probs)})
        return JSONResponse({"id": rid, "object": "list", "created": now(), "model": model,
                             "data": data, "usage": self._usage(outs)})

    async def _scores(self, raw: Request, pairs: list[tuple[str, str]], truncate: int | None,
                      activation: bool | None, prefix: str
                      ) -> tuple[str, list[float], dict[str, int]] | Response:
        """Relevance per pair: a cross-encoder's (both texts in one input), else the
        cosine of the two embeddings."""
        if self.driver.engine.num_labels:
            params = PoolingParams("score", None, None, activation, truncate)
            done = await self._run(raw, list(pairs), params, prefix)
            if isinstance(done, Response):
                return done
            rid, outs = done
            return rid, [float(o.outputs.data.reshape(-1)[0]) for o in outs], self._usage(outs)
        params = PoolingParams("embed", None, True, None, truncate)
        texts = list(dict.fromkeys([t for pair in pairs for t in pair]))
        done = await self._run(raw, texts, params, prefix)
        if isinstance(done, Response):
            return done
        rid, outs = done
        vec = {t: o.outputs.data for t, o in zip(texts, outs, strict=True)}
        scores = [float(torch.nn.functional.cosine_similarity(vec[a], vec[b], dim=0))
                  for a, b in pairs]
        return rid, scores, self._usage(outs)

    async def score(self, raw: Request, body: bytes) -> Response:
        req: ScoreRequest = parse_request(ScoreRequest, body)
        model = self.model_name(req.model)
        first = req.text_1 if req.text_1 is not None else req.queries
        second = req.text_2 if req.text_2 is not None else req.documents
        if first is None or second is None:
            raise APIError("give text_1 and text_2 (or queries and documents)", param="text_1")
        from glowlm.entrypoints.pooling_api import score_pairs

        try:
            pairs = score_pairs(first, second)
        except RequestError as exc:
            raise APIError(str(exc), param="text_2") from None
        done = await self._scores(raw, pairs, req.truncate_prompt_tokens, req.activation,
                                  "score")
        if isinstance(done, Response):
            return done
        rid, scores, usage = done
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return JSONResponse({"id": rid, "object": "list", "created": now(), "model": model,
                             "data": data, "usage": usage})

    async def rerank(self, raw: Request, body: bytes) -> Response:
        req: RerankRequest = parse_request(RerankRequest, body)
        model = self.model_name(req.model)
        texts = []
        for i, doc in enumerate(req.documents):
            text = doc if isinstance(doc, str) else doc.get("text")
            if not isinstance(text, str):
                raise APIError(f"documents[{i}] must be a string or an object with a 'text'",
                               param="documents")
            texts.append(text)
        if not texts:
            raise APIError("documents is empty", param="documents")
        done = await self._scores(raw, [(req.query, t) for t in texts],
                                  req.truncate_prompt_tokens, None, "rerank")
        if isinstance(done, Response):
            return done
        rid, scores, usage = done
        order = sorted(range(len(texts)), key=lambda i: -scores[i])
        if req.top_n:
            order = order[:req.top_n]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": texts[i]}} if req.return_documents else {})}
                   for i in order]
        return JSONResponse({"id": rid, "model": model, "usage": {
            "total_tokens": usage["total_tokens"]}, "results": results})
