"""``POST /v1/completions``: one engine request per prompt, ``n`` completions each.

Choice ``i * n + j`` is completion ``j`` of prompt ``i``, as in OpenAI's API
(``use_beam_search``: beam ``j`` of prompt ``i``, best first).
Streams send a chunk whenever a completion gained tokens, even when its text did
not grow (an incomplete UTF-8 character, a possible stop string held back), so
clients can time every token; the text of all chunks joined is exactly the
non-streamed text for the same seed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from glowlm.engine.outputs import CompletionOutput, RequestOutput
from glowlm.entrypoints.openai.errors import APIError
from glowlm.entrypoints.openai.protocol import CompletionRequest, parse_request
from glowlm.entrypoints.openai.responses import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionResponse,
    UsageInfo,
    prompt_logprob_ids,
    prompt_logprobs_json,
)
from glowlm.entrypoints.openai.serving_base import (
    GroupStreamingResponse,
    OpenAIServing,
    completion_logprobs,
    now,
    random_id,
    sse,
    with_stream_tail,
)
from glowlm.sampling.processors import truncate_prompt

_PROMPT_SHAPES = ("prompt must be a string, a list of strings, a list of token ids, or a list "
                  "of lists of token ids")


def normalize_prompts(prompt: Any) -> list[str | list[int]]:
    """The request's prompt(s) as a list of strings or token-id lists."""

    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise APIError(_PROMPT_SHAPES if prompt != [] else "prompt is empty", param="prompt")
    if is_ids(prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt) or all(is_ids(p) for p in prompt):
        return list(prompt)
    raise APIError(_PROMPT_SHAPES, param="prompt")


@dataclass
class _Batch:
    """One HTTP request's prompts, as queued, and what its responses need."""

    request_id: str
    model: str
    created: int
    n: int
    logprobs: int | None
    request_ids: list[str]
    prompt_ids: list[list[int]]
    echo_texts: list[str] | None = None
    echo_token_texts: list[list[str]] | None = None
    index_of: dict[str, int] = field(default_factory=dict)


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, raw: Request, body: bytes) -> Response:
        req: CompletionRequest = parse_request(CompletionRequest, body)
        req.check_stream_options()
        model, lora = self.resolve_model(req.model)
        if req.best_of is not None and req.best_of != req.n:
            raise APIError("best_of must equal n: glowlm returns every completion it samples",
                           param="best_of")
        if req.use_beam_search:
            self.check_beam_request(req, {"logprobs": req.logprobs is not None,
                                          "echo": req.echo,
                                          "prompt_logprobs": req.prompt_logprobs is not None})
        prompts = normalize_prompts(req.prompt)
        echo_logprobs = req.logprobs if req.echo else None
        prompt_logprobs = max((k for k in (echo_logprobs, req.prompt_logprobs) if k is not None),
                              default=None)
        max_tokens = req.max_tokens
        if max_tokens is None and "max_tokens" in self.generation_defaults:
            max_tokens = int(self.generation_defaults["max_tokens"])
        params = self.sampling_params(req, max_tokens=max_tokens, logprobs=req.logprobs,
                                      prompt_logprobs=prompt_logprobs)
        self.check_queue(len(prompts))
        prompts = [truncate_prompt(p, params, self.max_model_len) if isinstance(p, list) else p
                   for p in prompts]
        for p in prompts:
            if isinstance(p, str):
                self.check_prompt_chars(len(p), "prompt")
            elif len(p) >= self.max_model_len:
                self.check_prompt(p, params, "prompt")
        prompt_ids = await self.driver.run_tokenizer(self._tokenize_all, prompts)
        prompt_ids = [truncate_prompt(ids, params, self.max_model_len) for ids in prompt_ids]
        for ids in prompt_ids:
            self.check_prompt(ids, params, "prompt")
        batch = _Batch(random_id("cmpl"), model, now(), req.n, req.logprobs, [], prompt_ids)
        if req.use_beam_search:
            beams = await self.beam_search(raw, batch.request_id, prompt_ids,
                                           self.beam_params(req, params), lora)
            if beams is None:
                return Response(status_code=499)  # the client is gone; nobody reads this
            batch.request_ids = [out.request_id for out in beams]
            finals = {out.request_id: out for out in beams}
            return JSONResponse(self._response(batch, finals).model_dump())
        if req.echo:
            batch.echo_texts, batch.echo_token_texts = await self.driver.run_tokenizer(
                self._echo_texts, prompts, prompt_ids)
        group = self.driver.group()
        engine_prompts = [{"prompt_token_ids": ids, "prompt": p if isinstance(p, str) else None}
                          for p, ids in zip(prompts, prompt_ids, strict=True)]
        batch.request_ids = await self.add_all(group, batch.request_id, engine_prompts, params,
                                               lora)
        batch.index_of = {rid: i for i, rid in enumerate(batch.request_ids)}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return GroupStreamingResponse(self._stream(batch, group, include_usage), group)
        finals = await self.collect(raw, group)
        if finals is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        response = self._response(batch, finals)
        if req.prompt_logprobs is not None:
            entries = [finals[rid].prompt_logprobs for rid in batch.request_ids]
            wanted = sorted({t for e in entries for t in prompt_logprob_ids(e)})
            texts = dict(zip(wanted, await self.driver.run_tokenizer(
                self.driver.token_texts, wanted), strict=True))
            for choice in response.choices:
                choice.prompt_logprobs = prompt_logprobs_json(entries[choice.index // req.n],
                                                              texts)
        return JSONResponse(response.model_dump())

    # -- tokenizer-thread helpers -------------------------------------------------------

    def _tokenize_all(self, prompts: list[str | list[int]]) -> list[list[int]]:
        return [self.driver.tokenize(p) if isinstance(p, str) else list(p) for p in prompts]

    def _echo_texts(self, prompts: list[str | list[int]], prompt_ids: list[list[int]]
                    ) -> tuple[list[str], list[list[str]]]:
        tok = self.driver.tokenizer
        texts = [p if isinstance(p, str) else tok.decode(ids)
                 for p, ids in zip(prompts, prompt_ids, strict=True)]
        return texts, [self.driver.token_texts(ids) for ids in prompt_ids]

    # -- responses ----------------------------------------------------------------------

    def _logprobs(self, batch: _Batch, p: int, out: RequestOutput, o: CompletionOutput,
                  start: int, end: int, offset: int, echo: bool) -> CompletionLogProbs | None:
        if batch.logprobs is None:
            return None
        lp = CompletionLogProbs()
        if echo and batch.echo_token_texts is not None:
            lp = completion_logprobs(out.prompt_token_ids, out.prompt_logprobs or [], offset,
                                     batch.echo_token_texts[p])
            offset += sum(len(t) for t in batch.echo_token_texts[p])
        tail = completion_logprobs(o.token_ids[start:end], (o.logprobs or [])[start:end],
                                   offset)
        for name in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
            getattr(lp, name).extend(getattr(tail, name))
        return lp

    def _response(self, batch: _Batch, finals: dict[str, RequestOutput]) -> CompletionResponse:
        choices: list[CompletionChoice] = []
        usage = UsageInfo()
        for p, rid in enumerate(batch.request_ids):
            out = finals[rid]
            usage.prompt_tokens += len(out.prompt_token_ids)
            echo = batch.echo_texts[p] if batch.echo_texts is not None else ""
            for o in out.outputs:
                usage.completion_tokens += len(o.token_ids)
                choices.append(CompletionChoice(
                    index=p * batch.n + o.index, text=echo + o.text,
                    logprobs=self._logprobs(batch, p, out, o, 0, len(o.token_ids), 0,
                                            batch.echo_texts is not None),
                    finish_reason=o.finish_reason, stop_reason=o.stop_reason))
        choices.sort(key=lambda c: c.index)
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return CompletionResponse(id=batch.request_id, created=batch.created, model=batch.model,
                                  choices=choices, usage=usage)

    def _stream(self, batch: _Batch, group: Any, include_usage: bool) -> AsyncIterator[str]:
        head = {"id": batch.request_id, "object": "text_completion", "created": batch.created,
                "model": batch.model}
        usage = UsageInfo()
        return with_stream_tail(self._chunks(batch, group, head, usage), head, usage,
                                include_usage)

    async def _chunks(self, batch: _Batch, group: Any, head: dict[str, Any], usage: UsageInfo
                      ) -> AsyncIterator[str]:
        sent_chars: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        done: set[int] = set()
        async for out in group:
            p = batch.index_of[out.request_id]
            for o in out.outputs:
                index = p * batch.n + o.index
                if index in done:
                    continue
                chars, start, end = sent_chars.get(index), sent_tokens.get(index, 0), \
                    len(o.token_ids)
                delta = o.text[chars or 0:]
                if not delta and end == start and o.finish_reason is None:
                    continue
                first = chars is None
                echo = first and batch.echo_texts is not None
                prefix = batch.echo_texts[p] if echo and batch.echo_texts else ""
                offset = (chars or 0) + (len(batch.echo_texts[p])
                                         if batch.echo_texts and not first else 0)
                lp = self._logprobs(batch, p, out, o, start, end, offset, echo)
                sent_chars[index], sent_tokens[index] = len(o.text), end
                if o.finish_reason is not None:
                    done.add(index)
                yield sse({**head, "choices": [{
                    "index": index, "text": prefix + delta,
                    "logprobs": lp.model_dump() if lp else None,
                    "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}]})
            if out.finished:
                usage.prompt_tokens += len(out.prompt_token_ids)
                usage.completion_tokens += sum(len(o.token_ids) for o in out.outputs)
