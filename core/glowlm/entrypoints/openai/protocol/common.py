"""The request models every OpenAI-compatible endpoint shares, and how bodies are parsed.

Requests are parsed the way vLLM parses them: pydantic's lax mode (``"0.5"`` is
accepted for a float, ``16.0`` for an integer; ``2.5`` is still not an
integer), and fields glowlm does not know are ignored with one warning line in
the log naming them, so a client written for another server keeps working.
What cannot be served (a malformed value, an invalid schema, ``suffix``...) is
a 400 naming the field. Numeric ranges are checked once, by
:class:`~glowlm.sampling.params.SamplingParams`, not repeated here.

:class:`SamplingRequest` holds the fields completions and chat completions share
(OpenAI's, then vLLM's extras) and turns them into ``SamplingParams``, output
constraints (``structured_outputs``, ``guided_*``, ``response_format``) included.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from glowlm.entrypoints.openai.errors import APIError, validation_to_api_error
from glowlm.errors import RequestError
from glowlm.logger import init_logger
from glowlm.sampling.params import SamplingParams, StructuredOutputsParams

logger = init_logger(__name__)

#: JSON ints beyond this would overflow the int64 tensors the sampler builds.
INT_LIMIT = 2**62


def _ignored_fields(obj: BaseModel, where: str = "") -> list[str]:
    """Names of fields given but unknown (pydantic's ``model_extra``), nested ones dotted."""
    out: list[str] = []
    if isinstance(obj, OpenAIModel):
        out += [f"{where}{k}" for k in (obj.model_extra or {})]
    for name in type(obj).model_fields:
        value = getattr(obj, name, None)
        if isinstance(value, OpenAIModel):
            out += _ignored_fields(value, f"{where}{name}.")
    return out


def parse_request(model: type[BaseModel], body: bytes) -> Any:
    """Validate a body; unknown fields are dropped with one warning line (as vLLM does)."""
    try:
        req = model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_to_api_error(exc) from None
    ignored = _ignored_fields(req)
    if ignored:
        logger.warning("The following fields were present in the request but ignored: %s",
                       ", ".join(sorted(ignored)))
    return req


class OpenAIModel(BaseModel):
    """Lax parsing; unknown keys are kept aside (``model_extra``) to be logged, not used."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class JsonSchemaFormat(OpenAIModel):
    name: str = "schema"
    description: str | None = None
    #: OpenAI's key is ``schema``; pydantic reserves the attribute name.
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.json_schema is None):
            raise ValueError("type 'json_schema' needs json_schema.schema")
        return self


class StructuredOutputs(OpenAIModel):
    """vLLM's ``structured_outputs`` request field (one of these)."""

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)


class SamplingRequest(OpenAIModel):
    """Fields shared by completions and chat completions (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, le=INT_LIMIT)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-INT_LIMIT, le=INT_LIMIT)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    #: Token id (as a JSON string key) -> bias added to its logit, clamped to [-100, 100].
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extra sampling fields:
    top_k: int | None = Field(None, ge=-INT_LIMIT, le=INT_LIMIT)
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, le=INT_LIMIT)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = Field(None, le=INT_LIMIT)
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=INT_LIMIT)
    structured_outputs: StructuredOutputs | None = None
    #: vLLM's beam search: ``n`` beams, all returned as the ``n`` choices (not streamed).
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # vLLM's older names for structured_outputs:
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_ids(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            try:
                int(key)
            except ValueError:
                raise ValueError(f"keys must be token ids, got {key!r}") from None
        return v

    @field_validator("stop_token_ids", "allowed_token_ids")
    @classmethod
    def _token_ids_in_range(cls, v: list[int] | None) -> list[int] | None:
        if v and any(not 0 <= t < INT_LIMIT for t in v):
            raise ValueError("token ids must be non-negative integers")
        return v

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed when stream is true",
                           param="stream_options")

    def structured_spec(self) -> tuple[StructuredOutputsParams | None, str]:
        """The output constraint the request asks for, and the field that asked."""
        wanted: list[tuple[str, dict[str, Any]]] = []
        so = self.structured_outputs
        if so is not None:
            wanted.append(("structured_outputs", {
                "json": so.json_schema, "regex": so.regex, "choice": so.choice,
                "grammar": so.grammar, "json_object": so.json_object}))
        legacy = {"json": self.guided_json, "regex": self.guided_regex,
                  "choice": self.guided_choice, "grammar": self.guided_grammar}
        if any(v is not None for v in legacy.values()):
            wanted.append(("guided_json", legacy))
        rf = self.response_format
        if rf is not None and rf.type != "text":
            if rf.type == "json_object":
                wanted.append(("response_format", {"json_object": True}))
            else:
                assert rf.json_schema is not None
                wanted.append(("response_format", {"json": rf.json_schema.json_schema}))
        if not wanted:
            return None, ""
        if len(wanted) > 1:
            raise APIError(f"give one output constraint, not {wanted[0][0]} and "
                           f"{wanted[1][0]}", param=wanted[1][0])
        field, spec = wanted[0]
        try:
            return StructuredOutputsParams(**spec), field
        except RequestError as exc:
            raise APIError(str(exc), param=field) from None

    def to_sampling_params(self, *, max_tokens: int | None, logprobs: int | None,
                           prompt_logprobs: int | None,
                           defaults: dict[str, Any] | None = None,
                           max_logprobs: int = 20) -> SamplingParams:
        """SamplingParams for this request; fields it leaves out take ``defaults``
        (``--generation-config``), then OpenAI's defaults, as vLLM applies them."""
        d = defaults or {}

        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            if value is not None:
                return value
            return d.get(name, fallback)

        spec, field = self.structured_spec()
        if spec is not None:
            from glowlm.sampling.structured import grammar_of

            try:
                spec.compiled = grammar_of(spec)
            except RequestError as exc:
                raise APIError(str(exc), param=field, code="invalid_value") from None
        return SamplingParams(
            n=self.n, temperature=pick("temperature", 1.0), top_p=pick("top_p", 1.0),
            top_k=pick("top_k", 0), min_p=pick("min_p", 0.0), seed=self.seed,
            max_tokens=max_tokens, min_tokens=self.min_tokens, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=pick("repetition_penalty", 1.0),
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias
            else None,
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            truncate_prompt_tokens=self.truncate_prompt_tokens, structured_outputs=spec,
            max_logprobs=max_logprobs)
