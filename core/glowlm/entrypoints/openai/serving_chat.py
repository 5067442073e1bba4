"""``POST /v1/chat/completions``: messages through the chat template, then one engine request.

The template is the tokenizer's own, or the file given with ``--chat-template``.
The rendered text is tokenized without adding special tokens, because templates
write their own (a second BOS would change the model's output). Rendering runs
on the tokenizer thread like every other tokenizer call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from glowlm.engine.outputs import RequestOutput
from glowlm.entrypoints.openai.engine_loop import (
    AsyncEngine,
    RequestGroup,
)
from glowlm.entrypoints.openai.errors import APIError
from glowlm.entrypoints.openai.protocol import ChatCompletionRequest, parse_request
from glowlm.entrypoints.openai.responses import (
    ChatChoiceLogProbs,
    ChatCompletionChoice,
    ChatCompletionResponse,
    ChatResponseMessage,
    UsageInfo,
    prompt_logprob_ids,
    prompt_logprobs_json,
)
from glowlm.entrypoints.openai.serving_base import (
    GroupStreamingResponse,
    OpenAIServing,
    chat_logprobs,
    now,
    random_id,
    sse,
    with_stream_tail,
)
from glowlm.entrypoints.openai.serving_models import ServedModels
from glowlm.entrypoints.openai.tool_calling import ToolMode, tool_mode
from glowlm.entrypoints.openai.tool_parsers import get_tool_parser
from glowlm.sampling.processors import truncate_prompt
from glowlm.sampling.structured import grammar_of

#: Arguments of apply_chat_template that chat_template_kwargs may not override.
_RESERVED = frozenset({"conversation", "chat_template", "tokenize", "add_generation_prompt",
                       "return_dict", "return_tensors", "tools", "documents"})


class OpenAIServingChat(OpenAIServing):
    def __init__(self, driver: AsyncEngine, model_names: list[str],
                 chat_template: str | None, options: Any = None,
                 models: ServedModels | None = None) -> None:
        super().__init__(driver, model_names, options, models)
        self.chat_template = chat_template
        name = getattr(options, "tool_call_parser", None)
        self.tool_parser = get_tool_parser(name) if name else None
        self.auto_tools = bool(getattr(options, "enable_auto_tool_choice", False))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               kwargs: dict[str, Any] | None = None,
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Tokenizer thread only: the conversation's prompt token ids."""
        tok = self.driver.tokenizer
        if self.chat_template is None and not getattr(tok, "chat_template", None):
            raise APIError("this model's tokenizer has no chat template; start the server "
                           "with --chat-template FILE, or use /v1/completions",
                           param="messages", code="no_chat_template")
        bad = _RESERVED & set(kwargs or {})
        if bad:
            raise APIError(f"chat_template_kwargs may not set {', '.join(sorted(bad))}",
                           param="chat_template_kwargs")
        try:
            text = tok.apply_chat_template(messages, chat_template=self.chat_template,
                                           add_generation_prompt=add_generation_prompt,
                                           tokenize=False, tools=tools, **(kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - jinja raises many types, all user-caused
            raise APIError(f"cannot apply the chat template to messages: {exc}",
                           param="messages") from None
        return self.driver.tokenize(str(text), add_special_tokens=False)

    async def create(self, raw: Request, body: bytes) -> Response:
        req: ChatCompletionRequest = parse_request(ChatCompletionRequest, body)
        req.check_stream_options()
        model, lora = self.resolve_model(req.model)
        if req.use_beam_search:
            self.check_beam_request(req, {"logprobs": req.logprobs,
                                          "prompt_logprobs": req.prompt_logprobs is not None,
                                          "tools": bool(req.tools)})
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError("top_logprobs requires logprobs: true", param="top_logprobs")
        field = "max_completion_tokens" if req.max_completion_tokens is not None \
            else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
            else req.max_tokens
        top = req.top_logprobs or 0
        mode = tool_mode(req, self.tool_parser, self.auto_tools)
        default_max = max_tokens is None and "max_tokens" in self.generation_defaults
        if default_max:
            max_tokens = int(self.generation_defaults["max_tokens"])
        params = self.sampling_params(req, max_tokens=max_tokens,
                                      logprobs=top if req.logprobs else None,
                                      prompt_logprobs=req.prompt_logprobs,
                                      max_tokens_field=field)
        forced = mode.constraint(req)
        if forced is not None:
            if params.structured_outputs is not None:
                raise APIError(f"tool_choice {req.tool_choice!r} is enforced with structured "
                               "outputs; do not also give response_format or "
                               "structured_outputs", param="tool_choice")
            params.structured_outputs = forced
            forced.compiled = grammar_of(forced)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        self.check_queue(1)
        messages = [m.template_dict() for m in req.messages]
        self.check_prompt_chars(sum(len(str(m.get("content") or "")) for m in messages),
                                "messages")
        ids = await self.driver.run_tokenizer(self.render, messages, req.add_generation_prompt,
                                              req.chat_template_kwargs, tools)
        ids = truncate_prompt(ids, params, self.max_model_len)
        if default_max and params.max_tokens is not None:  # a default only fills the room
            params.max_tokens = max(1, min(params.max_tokens, self.max_model_len - len(ids)))
        self.check_prompt(ids, params, "messages", field)
        request_id = random_id("chatcmpl")
        head = {"id": request_id, "created": now(), "model": model}
        if req.use_beam_search:
            beams = await self.beam_search(raw, request_id, [ids],
                                           self.beam_params(req, params, field),
                                           lora)
            if beams is None:
                return Response(status_code=499)  # the client is gone; nobody reads this
            return JSONResponse(self._response(head, beams[0], None, mode).model_dump())
        group = self.driver.group()
        rid, = await self.add_all(group, request_id, [{"prompt_token_ids": ids}], params, lora)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return GroupStreamingResponse(
                self._stream(head, req.n, group, top if req.logprobs else None, include_usage,
                             mode), group)
        finals = await self.collect(raw, group)
        if finals is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        response = self._response(head, finals[rid], top if req.logprobs else None, mode)
        if req.prompt_logprobs is not None:
            entries = finals[rid].prompt_logprobs
            wanted = prompt_logprob_ids(entries)
            texts = dict(zip(wanted, await self.driver.run_tokenizer(
                self.driver.token_texts, wanted), strict=True))
            response.prompt_logprobs = prompt_logprobs_json(entries, texts)
        return JSONResponse(response.model_dump())

    def _response(self, head: dict[str, Any], out: RequestOutput,
                  top: int | None, mode: ToolMode | None = None) -> ChatCompletionResponse:
        mode = mode or ToolMode("none")
        choices = []
        for o in out.outputs:
            content, calls, reason = mode.message(o.text, o.finish_reason)
            choices.append(ChatCompletionChoice(
                index=o.index,
                message=ChatResponseMessage(content=content, tool_calls=calls),
                logprobs=ChatChoiceLogProbs(content=chat_logprobs(
                    o.token_ids, o.logprobs or [], top)) if top is not None else None,
                finish_reason=reason, stop_reason=o.stop_reason))
        completion = sum(len(o.token_ids) for o in out.outputs)
        usage = UsageInfo(prompt_tokens=len(out.prompt_token_ids),
                          completion_tokens=completion,
                          total_tokens=len(out.prompt_token_ids) + completion)
        return ChatCompletionResponse(**head, choices=choices, usage=usage)

    def _stream(self, head: dict[str, Any], n: int, group: RequestGroup,
                top: int | None, include_usage: bool,
                mode: ToolMode | None = None) -> AsyncIterator[str]:
        head = {**head, "object": "chat.completion.chunk"}
        usage = UsageInfo()
        return with_stream_tail(self._chunks(head, n, group, top, usage,
                                             mode or ToolMode("none")),
                                head, usage, include_usage)

    async def _chunks(self, head: dict[str, Any], n: int, group: RequestGroup,
                      top: int | None, usage: UsageInfo, mode: ToolMode) -> AsyncIterator[str]:
        states = [mode.stream_state() for _ in range(n)]
        sent_chars = [0] * n
        sent_tokens = [0] * n
        done: set[int] = set()
        for i in range(n):  # the role first, as OpenAI does, before any token exists
            yield sse({**head, "choices": [{"index": i, "delta": {"role": "assistant",
                                                                  "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
        async for out in group:
            for o in out.outputs:
                i = o.index
                if i in done:
                    continue
                start, end = sent_tokens[i], len(o.token_ids)
                delta = o.text[sent_chars[i]:]
                if not delta and end == start and o.finish_reason is None:
                    continue
                sent_chars[i], sent_tokens[i] = len(o.text), end
                lp = None
                if top is not None:
                    lp = {"content": [c.model_dump() for c in chat_logprobs(
                        o.token_ids[start:end], (o.logprobs or [])[start:end], top)]}
                if o.finish_reason is not None:
                    done.add(i)
                message = ({"content": delta} if mode.kind == "none"
                           else states[i].delta(o.text, o.finish_reason is not None))
                yield sse({**head, "choices": [{
                    "index": i, "delta": message, "logprobs": lp,
                    "finish_reason": states[i].finish_reason(o.finish_reason),
                    "stop_reason": o.stop_reason}]})
            if out.finished:
                usage.prompt_tokens = len(out.prompt_token_ids)
                usage.completion_tokens = sum(len(o.token_ids) for o in out.outputs)
