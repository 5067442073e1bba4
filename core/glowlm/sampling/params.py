"""SamplingParams: vLLM's field names and meanings, validated before anything is queued."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # Filled by the engine, not by users:
    stop_strings: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop_strings = []
        elif isinstance(self.stop, str):
            self.stop_strings = [self.stop]
        else:
            self.stop_strings = list(self.stop)
        if self.top_k == -1:
            self.top_k = 0
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
            if value is not None and (not isinstance(value, int) or not 0 <= value <= 20):
                raise bad(name, f"must be an integer in [0, 20], got {value!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        if self.n > 1 and self.greedy:
            pass  # allowed: n identical greedy completions, as vLLM does

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1.0)
