"""Requests and their sequences: the state the scheduler and runner share.

A request holds one prompt and ``n`` completions. It starts with one
:class:`Sequence`; when that sequence finishes its prompt, the scheduler forks
``n - 1`` more that share the prompt's KV blocks, so the prompt is computed once.
A sequence's ``token_ids`` are prompt + output; the runner computes positions
``num_computed_tokens ..`` and samples when all are computed. Preemption resets
``num_computed_tokens`` to 0 and keeps the output (recompute).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from glowlm.engine.outputs import PositionLogprobs, RequestMetrics
from glowlm.sampling.params import SamplingParams

if TYPE_CHECKING:
    from glowlm.engine.detokenizer import IncrementalDetokenizer
    from glowlm.lora.request import LoRARequest


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    request: Request
    index: int                       # which of the request's n completions
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0   # leading blocks already offered to the prefix cache
    num_dropped_blocks: int = 0      # leading blocks given back: behind every layer's window
    status: SequenceStatus = SequenceStatus.WAITING
    text: str = ""                   # output text so far (stop strings removed)
    emitted_chars: int = 0           # how much of ``text`` was released to streams
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    detokenizer: IncrementalDetokenizer | None = None
    noise_key: int = 0               # seed-derived key for reproducible sampling

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int                  # resolved: params.max_tokens or what fits the context
    eos_token_ids: frozenset[int]
    seed: int                        # the user's seed, or one drawn for this request
    arrival_time: float = field(default_factory=time.monotonic)
    seqs: list[Sequence] = field(default_factory=list)
    forked: bool = False
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    aborted: bool = False
    #: The adapter the request runs on (None: the base model).
    lora_request: LoRARequest | None = None

    @property
    def lora_id(self) -> int:
        """The adapter's id, 0 for the base model."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def cache_salt(self) -> bytes | None:
        """What the prefix cache's block hashes start from: an adapter's keys and values
        differ from the base model's for the same tokens."""
        return f"lora:{self.lora_id}".encode() if self.lora_request is not None else None

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(arrival_time=time.time())
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # the first prompt token has no logprob

    @property
    def finished(self) -> bool:
        return bool(self.seqs) and all(s.finished for s in self.seqs) and (
            self.forked or self.params.n == 1 or self.aborted
            or self.seqs[0].finish_reason is not None)
