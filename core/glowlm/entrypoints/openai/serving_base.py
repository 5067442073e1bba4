"""What completions and chat completions share: checks, sampling parameters, logprobs, SSE.

Every check that can fail for user input runs before anything is queued and
raises :class:`~glowlm.entrypoints.openai.errors.APIError` naming the field,
so a bad request is a 4xx and never a half-queued batch. After queueing, the
request's :class:`~glowlm.entrypoints.openai.engine_loop.RequestGroup` is closed
in a ``finally`` (or by the response, for streams) so nothing is left running
when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from glowlm.engine.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from glowlm.entrypoints.beam_search import (
    BeamSearchState,
    advance_all,
    candidates_of,
    check_beam_width,
    expansion_params,
    step_batch,
)
from glowlm.entrypoints.openai.engine_loop import (
    AsyncEngine,
    EngineFailure,
    RequestGroup,
    RequestsCancelled,
)
from glowlm.entrypoints.openai.errors import APIError, param_of
from glowlm.entrypoints.openai.protocol import SamplingRequest
from glowlm.entrypoints.openai.responses import ChatLogProb, ChatLogProbsContent, CompletionLogProbs
from glowlm.entrypoints.openai.serving_models import ServedModels
from glowlm.errors import LoRAError, RequestError
from glowlm.lora.request import LoRARequest
from glowlm.sampling.params import BeamSearchParams, SamplingParams

#: vLLM's stand-in for -inf, which JSON cannot carry.
_MIN_LOGPROB = -9999.0

#: Stop strings are matched against the text after every token, so their number and
#: length bound the per-token work a request may ask for (OpenAI allows 4).
MAX_STOP_STRINGS = 256
MAX_STOP_CHARS = 4096

#: The character bound of :meth:`OpenAIServing.check_prompt_chars` is this many times
#: (context length x longest token): slack for normalizers that shorten text (NFC).
_CHAR_SLACK = 2


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


#: Characters that ``str.splitlines`` - and so httpx's ``iter_lines`` and many SSE
#: clients built on it - treat as line ends although SSE ends lines at CR/LF only.
#: Sampled text may hold any of them; JSON-escaped, the decoded payload is the same and
#: no client cuts an event in two.
_LINE_BREAKS = {c: f"\\u{ord(c):04x}" for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
_ESCAPE_BREAKS = str.maketrans(_LINE_BREAKS)


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event. Whole strings only, so a UTF-8 character is never split."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload.translate(_ESCAPE_BREAKS)}\n\n"


def _lp(value: float) -> float:
    return _MIN_LOGPROB if math.isinf(value) or math.isnan(value) else max(value, _MIN_LOGPROB)


def _by_rank(entry: PositionLogprobs) -> list[Logprob]:
    return sorted(entry.values(), key=lambda lp: lp.rank if lp.rank is not None else 1 << 30)


def completion_logprobs(token_ids: Sequence[int], positions: Sequence[PositionLogprobs | None],
                        offset: int, texts: Sequence[str] | None = None) -> CompletionLogProbs:
    """The legacy completions format; ``texts`` overrides token texts (prompt echo)."""
    out = CompletionLogProbs()
    for i, tid in enumerate(token_ids):
        entry = positions[i] if i < len(positions) else None
        chosen = entry.get(tid) if entry else None
        if texts is not None:
            text = texts[i]
        else:
            text = (chosen.decoded_token or "") if chosen else ""
        out.tokens.append(text)
        out.text_offset.append(offset)
        offset += len(text)
        out.token_logprobs.append(_lp(chosen.logprob) if chosen else None)
        out.top_logprobs.append({lp.decoded_token or "": _lp(lp.logprob)
                                 for lp in _by_rank(entry)} if entry else None)
    return out


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[PositionLogprobs | None],
                  top: int) -> list[ChatLogProbsContent]:
    """The chat format: the chosen token, then the ``top`` most likely ones."""
    out = []
    for tid, entry in zip(token_ids, positions, strict=False):
        if entry is None or tid not in entry:
            continue
        chosen = entry[tid]
        text = chosen.decoded_token or ""
        tops = [ChatLogProb(token=lp.decoded_token or "", logprob=_lp(lp.logprob),
                            bytes=list((lp.decoded_token or "").encode()))
                for lp in _by_rank(entry) if lp.rank is not None and lp.rank <= top]
        out.append(ChatLogProbsContent(token=text, logprob=_lp(chosen.logprob),
                                       bytes=list(text.encode()), top_logprobs=tops[:top]))
    return out


class GroupStreamingResponse(StreamingResponse):
    """An SSE response that aborts its requests however it ends (disconnect included).

    Starlette cancels the streaming task when the client disconnects; the
    generator may not even have started, so the group is closed here rather than
    in the generator.
    """

    def __init__(self, content: Any, group: RequestGroup) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.group = group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.group.close()


class OpenAIServing:
    """State and checks shared by the completion and chat endpoints."""

    def __init__(self, driver: AsyncEngine, model_names: list[str],
                 options: Any = None, models: ServedModels | None = None) -> None:
        """``options``: the server's ServerOptions (generation defaults, logprob limit,
        tool calling); None in tests that build a bare serving object. ``models``: the
        names clients may send, LoRA adapters included, shared by every endpoint (so a
        runtime load is seen by all); default: ``model_names`` only."""
        self.driver = driver
        engine = driver.engine
        self.model_names = model_names
        self.models = models if models is not None else ServedModels(driver, model_names)
        self.generation_defaults: dict[str, Any] = dict(
            getattr(options, "generation_defaults", None) or {})
        limit = getattr(options, "max_logprobs", 20)
        self.max_logprobs = engine.vocab_size if limit == -1 else limit
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self.max_num_seqs = engine.config.max_num_seqs
        per_token = driver.max_token_chars
        self.max_prompt_chars = (_CHAR_SLACK * per_token * self.max_model_len
                                 if per_token else None)

    def check_prompt_chars(self, chars: int, param: str) -> None:
        """Refuse, before tokenizing, text that cannot fit the context whatever it says.

        No token covers more characters than the vocabulary's longest token string,
        so a text of more than ``max_model_len x that`` characters (x2 for normalizers)
        has more tokens than the context holds. Checking the length costs nothing;
        tokenizing megabytes costs seconds and memory.
        """
        limit = self.max_prompt_chars
        if limit is not None and chars > limit:
            raise APIError(f"{param} is too long: {chars} characters cannot fit this model's "
                           f"context of {self.max_model_len} tokens (at most {limit} "
                           "characters are tokenized)", param=param,
                           code="context_length_exceeded")

    def model_name(self, requested: str | None) -> str:
        """The name to echo in the response (a base name or an adapter's); 404 else."""
        return self.models.resolve(requested)[0]

    def resolve_model(self, requested: str | None) -> tuple[str, LoRARequest | None]:
        """The name to echo and the LoRA adapter to run on (None: the base model)."""
        return self.models.resolve(requested)

    def check_queue(self, count: int) -> None:
        """503 with Retry-After when admitting ``count`` more would exceed --max-queue.

        Only requests that would have to wait count: free batch slots take new
        requests at once, so ``--max-queue 0`` still serves up to --max-num-seqs.
        """
        limit = self.driver.max_queue
        if limit is None:
            return
        waiting = self.driver.num_waiting
        free_slots = max(0, self.max_num_seqs - self.driver.snapshot.num_running - waiting)
        if waiting + max(0, count - free_slots) <= limit:
            return
        recent = self.driver.metrics.recent_e2e
        hint = max(1, min(60, math.ceil(sum(recent) / len(recent)))) if recent else 1
        raise APIError(f"the server is at capacity: {waiting} requests are waiting "
                       f"(--max-queue {limit}); retry in about {hint} s", status=503,
                       code="queue_full", headers={"Retry-After": str(hint)})

    def sampling_params(self, req: SamplingRequest, *, max_tokens: int | None,
                        logprobs: int | None, prompt_logprobs: int | None = None,
                        max_tokens_field: str = "max_tokens") -> SamplingParams:
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise APIError(f"stop: at most {MAX_STOP_STRINGS} strings of at most "
                           f"{MAX_STOP_CHARS} characters each", param="stop")
        if req.n > self.max_num_seqs:
            raise APIError(f"n={req.n} exceeds this server's --max-num-seqs "
                           f"({self.max_num_seqs})", param="n")
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and value > self.max_logprobs:
                field_name = "top_logprobs" if name == "logprobs" and hasattr(
                    req, "top_logprobs") else name
                raise APIError(f"{field_name}={value} exceeds this server's --max-logprobs "
                               f"({self.max_logprobs})", param=field_name)
        try:
            params = req.to_sampling_params(
                max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                defaults=self.generation_defaults, max_logprobs=self.max_logprobs)
            params.check_vocab(self.vocab_size)
            return params
        except RequestError as exc:
            msg = str(exc)
            param = param_of(msg, set(type(req).model_fields) | {"max_tokens"})
            if param == "max_tokens" and max_tokens_field != "max_tokens":
                msg, param = msg.replace("max_tokens", max_tokens_field), max_tokens_field
            raise APIError(msg, param=param, code="invalid_value") from None

    def check_prompt(self, token_ids: list[int], params: SamplingParams, param: str,
                     max_tokens_field: str = "max_tokens") -> None:
        """The engine's own checks, done here so the error names the request's field."""
        if not token_ids:
            raise APIError(f"{param} is empty", param=param)
        if any(not 0 <= t < self.vocab_size for t in token_ids):
            raise APIError(f"{param}: token ids must be in [0, {self.vocab_size})", param=param)
        n, limit = len(token_ids), self.max_model_len
        if n >= limit:
            raise APIError(f"this model's maximum context length is {limit} tokens, but "
                           f"{param} has {n} tokens", param=param,
                           code="context_length_exceeded")
        if params.max_tokens is not None and n + params.max_tokens > limit:
            raise APIError(f"{max_tokens_field}={params.max_tokens} does not fit: {param} has "
                           f"{n} tokens and the context length is {limit} ({limit - n} tokens "
                           f"left)", param=max_tokens_field, code="context_length_exceeded")

    async def add_all(self, group: RequestGroup, request_id: str,
                      prompts: list[dict[str, Any]], params: SamplingParams,
                      lora_request: LoRARequest | None = None) -> list[str]:
        """Queue one engine request per prompt (on ``lora_request``'s adapter); all or
        nothing."""
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        try:
            for rid, prompt in zip(ids, prompts, strict=True):
                await group.add(rid, prompt, params, lora_request)
        except LoRAError as exc:  # unloaded while this request was being prepared
            group.close()
            raise APIError(f"the model {lora_request.lora_name if lora_request else None!r} "
                           f"does not exist: {exc}", status=404, param="model",
                           code="model_not_found") from None
        except RequestError as exc:
            group.close()
            raise APIError(str(exc), param="prompt") from None
        except BaseException:
            group.close()
            raise
        return ids

    # -- beam search (use_beam_search) ---------------------------------------------------

    def check_beam_request(self, req: SamplingRequest, unsupported: dict[str, bool]) -> None:
        """400 for what beam search cannot do, before anything is tokenized or queued.

        The beams are only known when the search ends, so nothing can stream;
        ``unsupported`` names the endpoint's fields that beam search does not fill.
        """
        if req.stream:
            raise APIError("use_beam_search does not stream: the best beams are only known "
                           "when the search ends; send stream: false", param="stream")
        for name, given in unsupported.items():
            if given:
                raise APIError(f"{name} is not supported with use_beam_search", param=name)

    def beam_params(self, req: SamplingRequest, params: SamplingParams,
                    max_tokens_field: str = "max_tokens") -> BeamSearchParams:
        """vLLM's reading of a request as beam search: ``n`` beams, the request's
        ``max_tokens`` (None: as many as the context holds, per prompt), temperature
        (default 1: the raw distribution), ``ignore_eos``, ``length_penalty``,
        ``include_stop_str_in_output``. ``params``: the request's SamplingParams, whose
        checks (:meth:`sampling_params`) have passed."""
        if params.structured_outputs is not None:
            raise APIError("structured outputs (response_format, structured_outputs, a "
                           "forced tool_choice) are not supported with use_beam_search",
                           param="use_beam_search")
        max_tokens = params.max_tokens
        temperature = req.temperature
        if temperature is None:
            temperature = self.generation_defaults.get("temperature", 1.0)
        try:
            params = BeamSearchParams(
                beam_width=req.n, max_tokens=max_tokens if max_tokens is not None
                else self.max_model_len, ignore_eos=req.ignore_eos, temperature=temperature,
                length_penalty=req.length_penalty,
                include_stop_str_in_output=req.include_stop_str_in_output)
            check_beam_width(params, self.vocab_size)
        except RequestError as exc:
            msg = str(exc).replace("beam_width", "n")
            param = "n" if msg.startswith("n") else param_of(msg, set(type(req).model_fields))
            if msg.startswith("max_tokens") and max_tokens_field != "max_tokens":
                msg, param = msg.replace("max_tokens", max_tokens_field), max_tokens_field
            raise APIError(msg, param=param, code="invalid_value") from None
        return params

    async def beam_search(self, raw: Request, request_id: str, prompt_ids: list[list[int]],
                          params: BeamSearchParams, lora_request: LoRARequest | None
                          ) -> list[RequestOutput] | None:
        """Run the search (glowlm.entrypoints.beam_search) through the engine loop: every
        step, all live beams of all prompts are one request group. Returns one finished
        RequestOutput per prompt whose ``n`` outputs are its beams, best first, so the
        endpoints answer as for sampling; None if the client went away."""
        eos = self.driver.engine.eos_token_ids
        states = [BeamSearchState(ids, params, min(params.max_tokens,
                                                   self.max_model_len - len(ids)), eos)
                  for ids in prompt_ids]
        step_params = expansion_params(params)
        step = 0
        while True:
            active, seqs = step_batch(states)
            if not active:
                break
            group = self.driver.group()
            rids = await self.add_all(group, f"{request_id}-step{step}",
                                      [{"prompt_token_ids": ids} for ids in seqs], step_params,
                                      lora_request)
            finals = await self.collect(raw, group)
            if finals is None:
                return None
            advance_all(active, [candidates_of(finals[rid]) for rid in rids])
            step += 1
        tokenizer = self.driver.tokenizer

        def decode(ids: list[int], skip_special: bool) -> str:
            return tokenizer.decode(ids, skip_special_tokens=skip_special)

        results = await self.driver.run_tokenizer(
            lambda: [s.result(decode) for s in states])
        outputs = []
        for i, (ids, result) in enumerate(zip(prompt_ids, results, strict=True)):
            completions = [CompletionOutput(
                index=j, text=seq.text or "", token_ids=seq.tokens[len(ids):],
                cumulative_logprob=seq.cum_logprob, finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason) for j, seq in enumerate(result.sequences)]
            outputs.append(RequestOutput(
                request_id=f"{request_id}-{i}", prompt=None, prompt_token_ids=ids,
                prompt_logprobs=None, outputs=completions, finished=True))
        return outputs

    async def collect(self, raw: Request, group: RequestGroup) -> dict[str, RequestOutput] | None:
        """Final outputs by request id; None if the client went away (requests aborted)."""
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await raw.receive())["type"] != "http.disconnect":
                pass
            gone = True
            group.cancel()

        watcher = asyncio.create_task(watch())
        finals: dict[str, RequestOutput] = {}
        try:
            async for out in group:
                if out.finished:
                    finals[out.request_id] = out
        except RequestsCancelled as exc:
            if gone:
                return None
            raise APIError(str(exc), status=503, code="shutting_down") from None
        except EngineFailure as exc:
            raise APIError(str(exc), status=500, code="engine_failure") from None
        finally:
            watcher.cancel()
            group.close()
        return finals


async def with_stream_tail(chunks: AsyncIterator[str], head: dict[str, Any], usage: Any,
                           include_usage: bool) -> AsyncIterator[str]:
    """The end every stream shares: an engine failure as an error event, else the usage
    chunk (when asked for; ``usage`` is filled by ``chunks`` as it goes), then ``[DONE]``.

    Closing this generator (client gone) closes ``chunks`` at once, so the request
    group's own cleanup runs now and not whenever the inner generator is collected.
    """
    try:
        async for chunk in chunks:
            yield chunk
    except (RequestsCancelled, EngineFailure) as exc:
        yield stream_error(exc)
    else:
        if include_usage:
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
            yield sse({**head, "choices": [], "usage": usage.model_dump()})
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    yield sse("[DONE]")


def stream_error(exc: BaseException) -> str:
    """The error event ending a stream: the same ``type`` and (string) ``code`` as the
    plain-body error of the same failure (see :meth:`OpenAIServing.collect`)."""
    if isinstance(exc, RequestsCancelled):
        typ, code = "service_unavailable", "shutting_down"
    else:
        typ, code = "server_error", "engine_failure"
    return sse({"error": {"message": str(exc), "type": typ, "param": None, "code": code}})
