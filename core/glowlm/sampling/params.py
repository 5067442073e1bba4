"""SamplingParams: vLLM's field names and meanings, validated before anything is queued."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from glowlm.errors import RequestError

_EPS = 1e-5


@dataclass
class SamplingParams:
    """How to sample one request's completions.

    ``temperature=0`` is greedy. ``logprobs=k`` returns the chosen token's
    log-probability plus the top ``k`` per generated token, computed from the
    model's raw distribution (before temperature, penalties and truncation), as
    vLLM does by default; ``prompt_logprobs=k`` does the same for prompt tokens.
    ``seed`` makes a request's samples reproducible whatever else is batched
    with it.

    vLLM's extras: ``logit_bias`` (token id -> value added to the logit, clamped to
    [-100, 100] as OpenAI does), ``allowed_token_ids`` (only these may be sampled),
    ``bad_words`` (words never generated: a word's last token is banned where the
    output ends with the word's other tokens), ``truncate_prompt_tokens`` (keep
    the prompt's last k tokens; -1: as many as the context holds) and
    ``structured_outputs`` (a grammar the output must match, applied as a token
    mask: see :mod:`glowlm.sampling.structured`).
    ``logprobs_after_temperature=True`` reports logprobs of the temperature-scaled
    distribution instead (what beam search ranks by).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    #: Logprobs from the temperature-scaled distribution (``log_softmax(logits / T)``)
    #: instead of the raw one: beam search scores its candidates this way when
    #: ``temperature > 0`` (glowlm.entrypoints.beam_search); greedy rows are unaffected.
    logprobs_after_temperature: bool = False
    #: The most logprobs / prompt_logprobs allowed: vLLM's default 20; the server passes
    #: its --max-logprobs.
    max_logprobs: int = field(default=20, repr=False)
    # Filled by the engine, not by users:
    stop_strings: list[str] = field(default_factory=list, init=False, repr=False)
    #: ``bad_words`` as token ids (each word with and without a leading space).
    bad_words_token_ids: list[list[int]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop_strings = []
        elif isinstance(self.stop, str):
            self.stop_strings = [self.stop]
        else:
            self.stop_strings = list(self.stop)
        if self.top_k == -1:
            self.top_k = 0
        if self.logit_bias:
            self.logit_bias = {int(k): max(-100.0, min(100.0, float(v)))
                               for k, v in self.logit_bias.items()}
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < _EPS

    def validate(self) -> None:
        def bad(name: str, why: str) -> RequestError:
            return RequestError(f"{name} {why}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be an integer >= 1, got {self.n!r}")
        if self.temperature < 0:
            raise bad("temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", f"must be an integer, got {self.seed!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"({self.min_tokens}) must be <= max_tokens "
                      f"({self.max_tokens})")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise bad("stop", "must be a non-empty string or a list of non-empty strings")
        if self.stop_token_ids is not None and any(
                not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be a list of non-negative integers")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int)
                                      or not 0 <= value <= self.max_logprobs):
                raise bad(name, f"must be an integer in [0, {self.max_logprobs}], got "
                          f"{value!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        if self.n > 1 and self.greedy:
            pass  # allowed: n identical greedy completions, as vLLM does
        if self.logit_bias and any(t < 0 for t in self.logit_bias):
            raise bad("logit_bias", "keys must be non-negative token ids")
        if self.allowed_token_ids is not None and (
                not self.allowed_token_ids
                or any(not isinstance(t, int) or t < 0 for t in self.allowed_token_ids)):
            raise bad("allowed_token_ids", "must be a non-empty list of non-negative token ids")
        if self.bad_words is not None and any(
                not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise bad("bad_words", "must be a list of non-empty strings")
        t = self.truncate_prompt_tokens
        if t is not None and (not isinstance(t, int) or (t < 1 and t != -1)):
            raise bad("truncate_prompt_tokens", f"must be -1 or an integer >= 1, got {t!r}")

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the request names must exist in the model's vocabulary."""
        for name, ids in (("logit_bias", list(self.logit_bias or ())),
                          ("allowed_token_ids", self.allowed_token_ids or [])):
            wrong = [t for t in ids if t >= vocab_size]
            if wrong:
                raise RequestError(f"{name} has token id {wrong[0]} outside the vocabulary "
                                   f"[0, {vocab_size})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value > vocab_size:
                raise RequestError(f"{name} must be <= the vocabulary size ({vocab_size})")

    @property
    def needs_processors(self) -> bool:
        """Whether the sampler must build per-row masks or biases for this request."""
        return bool(self.logit_bias or self.allowed_token_ids is not None
                    or self.bad_words_token_ids or self.structured_outputs is not None)

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1.0)


@dataclass
class StructuredOutputsParams:
    """vLLM's ``structured_outputs``: exactly one of these constrains the output.

    ``json`` is a JSON schema (dict or its text); ``json_object`` any JSON
    object; ``regex`` a regular expression; ``choice`` one of these strings;
    ``grammar`` a Lark or GBNF grammar (llguidance reads both).
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    #: The llguidance grammar, compiled once (glowlm.sampling.structured.grammar_of).
    compiled: str | None = field(default=None, repr=False)
    #: The GrammarEngine of the engine serving the request (set when it is added).
    engine: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise RequestError("structured_outputs must set exactly one of json, regex, "
                               f"choice, grammar, json_object (got {given or 'none'})")
        if self.choice is not None and (not self.choice or not all(
                isinstance(c, str) and c for c in self.choice)):
            raise RequestError("structured_outputs.choice must be a non-empty list of "
                               "non-empty strings")


@dataclass
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``: the settings of :meth:`glowlm.LLM.beam_search`.

    ``beam_width`` hypotheses are kept at every step, each expanded by its
    ``2 * beam_width`` most likely next tokens; a hypothesis ends at an EOS token
    (unless ``ignore_eos``) or after ``max_tokens`` generated tokens. Candidates are
    ranked by cumulative log-probability (of ``log_softmax(logits / temperature)``
    when ``temperature > 0``); finished ones by ``cum_logprob / len ** length_penalty``
    with ``len`` the generated tokens, the EOS included (transformers' rule).
    ``include_stop_str_in_output`` keeps a finishing EOS token in the returned tokens
    and text.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RequestError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.temperature, int | float) or self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature!r}")
        if (not isinstance(self.length_penalty, int | float)
                or self.length_penalty != self.length_penalty
                or abs(self.length_penalty) == float("inf")):
            raise RequestError(f"length_penalty must be a finite number, got "
                               f"{self.length_penalty!r}")
