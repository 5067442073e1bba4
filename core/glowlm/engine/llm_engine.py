"""The engine loop: requests in, one scheduled step at a time, outputs out.

``step()`` reads in one screen: schedule, execute, apply the new tokens (stop
checks, detokenization), free what finished, report. The engine is
single-threaded; the server drives it from one asyncio task.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from glowlm.config import EngineConfig
from glowlm.distributed.shm import RankFailure
from glowlm.engine.block_manager import BlockManager
from glowlm.engine.detokenizer import IncrementalDetokenizer
from glowlm.engine.model_runner import ModelRunner, StepResult
from glowlm.engine.outputs import CompletionOutput, RequestOutput
from glowlm.engine.ranks import Ranks, StartRanks
from glowlm.engine.scheduler import Scheduler, SchedulerOutput
from glowlm.engine.sequence import Request, Sequence
from glowlm.engine.setup import EngineSetup, build_engine_parts
from glowlm.engine.spec_decode.speculator import Speculator
from glowlm.errors import ConfigError, RequestError
from glowlm.logger import init_logger
from glowlm.sampling.params import SamplingParams
from glowlm.sampling.processors import prepare_params, truncate_prompt

if TYPE_CHECKING:
    from glowlm.lora.manager import LoRAManager
    from glowlm.lora.request import LoRARequest

logger = init_logger(__name__)

LATENCY_SAMPLES = 100_000
#: Per-request samples beside the latencies, for the server's metrics: time per output
#: token, queue / prefill / decode / inference time (seconds), prompt and generated token
#: counts when a request finishes, and every prompt's length when it is first scheduled
#: ("prompt_tokens": vLLM counts prefix-cache hits as prompt tokens too).
REQUEST_SAMPLES = ("tpot", "queue", "prefill", "decode", "inference", "prompt_len", "gen_len",
                   "prompt_tokens")


@dataclass
class EngineStats:
    prompt_tokens: int = 0          # prompt tokens computed (cache hits excluded)
    generation_tokens: int = 0
    steps: int = 0
    forward_seconds: float = 0.0
    sample_seconds: float = 0.0
    prepare_seconds: float = 0.0
    step_seconds: float = 0.0
    finished_requests: int = 0
    #: Latency samples (seconds) since a consumer last drained them (the server does,
    #: every step); bounded so a long-lived offline engine does not grow without end.
    latencies: dict[str, deque[float]] = field(default_factory=lambda: {
        kind: deque(maxlen=LATENCY_SAMPLES) for kind in ("ttft", "itl", "e2e", *REQUEST_SAMPLES)})


class LLMEngine:
    def __init__(self, config: EngineConfig, show_progress: bool = True,
                 ranks: StartRanks | None = None) -> None:
        """``ranks`` starts the other ranks when TP x PP > 1 (this process is rank 0):
        :func:`glowlm.executor.start_ranks`, which the offline API, the server, the
        benchmarks and the data-parallel replicas pass."""
        self.executor: Ranks | None = None
        link = None
        if config.world_size > 1:
            if ranks is None:
                raise ConfigError(
                    f"a {config.world_size}-rank engine needs its ranks started: build it with "
                    "LLMEngine(config, ranks=glowlm.executor.start_ranks)")
            self.executor = ranks(config)
            link = self.executor.link()
        try:
            setup: EngineSetup = build_engine_parts(config, show_progress, link=link)
        except BaseException:
            if self.executor is not None:
                self.executor.shutdown()
            raise
        self.setup = setup
        self.config = setup.config
        self.platform = setup.platform
        self.tokenizer = setup.tokenizer
        self.model_info = setup.info
        self.max_model_len = setup.max_model_len
        self.eos_token_ids = frozenset(setup.info.eos_token_ids)
        self.vocab_size = setup.vocab_size
        self.block_manager = BlockManager(setup.num_blocks, self.config.block_size,
                                          self.config.enable_prefix_caching,
                                          window=setup.kv_window)
        spec = self.config.speculative_config
        #: Speculative decoding (engine/spec_decode), when --speculative-config asks.
        self.speculator: Speculator | None = None
        if spec is not None:
            proposer, draft_len = None, None
            if setup.draft is not None:  # draft_model: its proposer runs the loaded draft
                from glowlm.engine.spec_decode.draft_model import DraftModelProposer

                proposer = DraftModelProposer(setup.draft, self.config.max_num_batched_tokens)
                draft_len = setup.draft.max_model_len
            self.speculator = Speculator(spec, self.max_model_len, proposer, draft_len)
        #: --enable-lora: the adapters, their slots, which the batch pins (glowlm.lora).
        self.lora: LoRAManager | None = None
        if setup.parts.lora is not None:
            from glowlm.lora.manager import LoRAManager

            self.lora = LoRAManager(setup.model, self.config.max_loras,
                                    self.config.max_lora_rank,
                                    partial=self.config.pipeline_parallel_size > 1)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_batched_tokens,
                                   self.config.max_num_seqs, speculator=self.speculator,
                                   admit=self._lora_admit if self.lora is not None else None)
        self.runner = ModelRunner(setup.model, setup.parts.attention_backend, setup.num_blocks,
                                  self.config.block_size, setup.kv_dtype or setup.parts.dtype,
                                  parallel=setup.parts.parallel,
                                  comms=self.executor.comms if self.executor else None,
                                  executor=self.executor, lora_state=setup.parts.lora)
        self.runner.lora = self.lora
        if self.executor is not None:
            self.executor.started_loop()
        self.requests: dict[str, Request] = {}
        self.stats = EngineStats()
        self._rng = random.Random(self.config.seed)

    # -- requests -----------------------------------------------------------------------

    def tokenize(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt)

    def validate_prompt(self, token_ids: Seq[int], params: SamplingParams) -> int:
        """Check a prompt against the context and vocabulary; return the resolved max_tokens."""
        if not token_ids:
            raise RequestError("prompt is empty")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in token_ids):
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        n = len(token_ids)
        if n >= self.max_model_len:
            raise RequestError(f"prompt has {n} tokens, but the context length "
                               f"(max_model_len) is {self.max_model_len}")
        room = self.max_model_len - n
        if params.max_tokens is None:
            return room
        if params.max_tokens > room:
            raise RequestError(
                f"max_tokens={params.max_tokens} does not fit: the prompt has {n} tokens and "
                f"the context length is {self.max_model_len} ({room} tokens left)")
        return params.max_tokens

    # -- adapters -----------------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Register an adapter (read and checked now); False if it was known already.
        Raises LoRAError if it cannot be served, ConfigError without --enable-lora."""
        return self._lora_manager().register(lora_request)

    def remove_lora(self, name: str) -> None:
        """Unregister ``name``: new requests cannot name it; running ones finish on it."""
        self._lora_manager().unregister(name)

    def list_loras(self) -> list[LoRARequest]:
        return self.lora.names() if self.lora is not None else []

    def _lora_manager(self) -> LoRAManager:
        if self.lora is None:
            raise ConfigError("LoRA adapters need the engine started with --enable-lora "
                              "(LLM(..., enable_lora=True))")
        return self.lora

    def _lora_admit(self, seq: Sequence, running: list[Sequence]) -> bool:
        lora_id = seq.request.lora_id
        if not lora_id:
            return True
        assert self.lora is not None
        return self.lora.admit(lora_id, {s.request.lora_id for s in running} - {0})

    def _released(self, request: Request) -> None:
        """A request left the engine (finished or aborted)."""
        if self.lora is not None and request.lora_id:
            self.lora.finished(request.lora_id)

    # -- requests (continued) -------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int] | dict[str, Any],
                    params: SamplingParams | None = None,
                    lora_request: LoRARequest | None = None) -> Request:
        """Validate and queue a request; raises RequestError before queueing anything.
        ``lora_request``: run it on that adapter (registered on first use)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        if lora_request is not None:
            if self.lora is None:
                raise RequestError(f"request names LoRA adapter {lora_request.lora_name!r} "
                                   "but the engine was started without --enable-lora")
            self.lora.register(lora_request)
        text, token_ids = self.prompt_ids(prompt)
        token_ids = truncate_prompt(token_ids, params, self.max_model_len)
        max_tokens = self.validate_prompt(token_ids, params)
        # bad_words tokenized, token ids checked, grammar attached (sampling.processors):
        prepare_params(params, self.tokenizer, self.vocab_size, self.eos_token_ids)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = Request(request_id, text, token_ids, params, max_tokens,
                          frozenset() if params.ignore_eos else self.eos_token_ids, seed,
                          lora_request=lora_request)
        seq = Sequence(self.scheduler.new_seq_id(), request, 0, list(token_ids), len(token_ids),
                       logprobs=[] if params.logprobs is not None else None)
        request.seqs.append(seq)
        self.requests[request_id] = request
        if self.lora is not None and request.lora_id:
            self.lora.started(request.lora_id)
        self.scheduler.add(seq)
        return request

    def prompt_ids(self, prompt: str | list[int] | dict[str, Any]
                   ) -> tuple[str | None, list[int]]:
        """``(text, token ids)`` of a prompt as :meth:`add_request` takes it: text, token
        ids, or a dict of either (``prompt_token_ids`` wins; ``prompt`` is kept as text)."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return prompt["prompt"], self.tokenize(prompt["prompt"])
            raise RequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            return prompt, self.tokenize(prompt)
        return None, list(prompt)

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free its KV blocks (unknown ids are ignored)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        request.aborted = True
        self._released(request)
        for seq in request.seqs:
            if not seq.finished:
                seq.finish_reason = "abort"
                self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.finished(seq)

    def shutdown(self) -> None:
        """Stop the other ranks' processes (TP/PP); idempotent, also run at exit."""
        if self.executor is not None:
            self.executor.shutdown()

    @property
    def failure(self) -> str | None:
        """The line that ended this engine's TP/PP group (a rank or a host gone), if any:
        the server's /health reports it."""
        return self.executor.failure if self.executor is not None else None

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    # -- the loop -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return an output for every request that progressed."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        now = time.time()
        for item in out.scheduled:
            m = item.seq.request.metrics
            if m is not None and m.first_scheduled_time is None:
                m.first_scheduled_time = now
                self.stats.latencies["prompt_tokens"].append(len(item.seq.request.prompt_token_ids))
        try:
            result = self.runner.execute(out)
        except RankFailure:
            self.shutdown()
            if self.executor is not None and self.executor.failure:
                raise RankFailure(self.executor.failure) from None
            raise
        for item in out.scheduled:
            seq = item.seq
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                self.stats.prompt_tokens += min(item.num_new_tokens,
                                                seq.num_prompt_tokens - seq.num_computed_tokens)
            # A verification computed the accepted drafts; the rejected ones roll back.
            rejected = len(item.draft_token_ids) - result.accepted.get(seq.seq_id, 0)
            seq.num_computed_tokens += item.num_new_tokens - rejected
            self.block_manager.cache_computed_blocks(seq)
        touched = self._apply(result)
        if self.speculator is not None:
            self._speculated(out, result, time.perf_counter() - t0)
        self._record_step(result, time.perf_counter() - t0)
        return [self._output(r) for r in touched]

    def _speculated(self, out: SchedulerOutput, result: StepResult, seconds: float) -> None:
        """Hand the step's verifications and timing to the speculator; give back the KV
        blocks that only rejected drafts used."""
        assert self.speculator is not None
        drafted = False
        for item in out.scheduled:
            if item.draft_token_ids:
                drafted = True
                self.speculator.observe(item.seq, len(item.draft_token_ids),
                                        result.accepted.get(item.seq.seq_id, 0))
                if not item.seq.finished:
                    self.block_manager.trim(item.seq)
        if all(item.draft_token_ids or item.num_new_tokens == 1 for item in out.scheduled):
            self.speculator.observe_step(out.num_tokens, drafted, seconds)

    def _apply(self, result: StepResult) -> list[Request]:
        touched: dict[str, Request] = {}
        for key, entries in result.prompt_logprobs.items():
            request = next(r for r in self.requests.values() if id(r) == key)
            assert request.prompt_logprobs is not None
            request.prompt_logprobs.extend(entries)
        now = time.time()
        for i, seq in enumerate(result.seqs):
            if seq.finished:
                continue
            token = result.tokens[i]
            seq.token_ids.append(token)
            self.stats.generation_tokens += 1
            if seq.logprobs is not None and result.logprobs[i] is not None:
                seq.logprobs.append(result.logprobs[i])
                seq.cumulative_logprob += result.cumulative[i]
            request = seq.request
            m = request.metrics
            if m is not None:
                if m.first_token_time is None:
                    m.first_token_time = now
                    self.stats.latencies["ttft"].append(now - m.arrival_time)
                elif m.last_token_time is not None and seq.index == 0:
                    self.stats.latencies["itl"].append(now - m.last_token_time)
                m.last_token_time = now
            self._check_stop(seq, token)
            if seq.finish_reason is not None:
                self._finish(seq)
            touched[request.request_id] = request
        for request in touched.values():
            if request.finished:
                self.requests.pop(request.request_id, None)
                self._released(request)
                self.stats.finished_requests += 1
                if request.metrics is not None:
                    request.metrics.finished_time = now
                    self.stats.latencies["e2e"].append(now - request.metrics.arrival_time)
                    self._request_samples(request, now)
        return list(touched.values())

    def _request_samples(self, request: Request, now: float) -> None:
        """Queue, prefill, decode and inference time and token counts of a finished request."""
        m, lat = request.metrics, self.stats.latencies
        assert m is not None
        generated = sum(s.num_output_tokens for s in request.seqs)
        lat["prompt_len"].append(len(request.prompt_token_ids))
        lat["gen_len"].append(generated)
        if m.first_scheduled_time is None or m.first_token_time is None:
            return
        lat["queue"].append(m.first_scheduled_time - m.arrival_time)
        lat["prefill"].append(m.first_token_time - m.first_scheduled_time)
        lat["decode"].append(now - m.first_token_time)
        lat["inference"].append(now - m.first_scheduled_time)
        first = request.seqs[0].num_output_tokens if request.seqs else 0
        if first > 1:
            lat["tpot"].append((now - m.first_token_time) / (first - 1))

    def _check_stop(self, seq: Sequence, token: int) -> None:
        params = seq.request.params
        if seq.detokenizer is None:
            seq.detokenizer = IncrementalDetokenizer(
                self.tokenizer, seq.token_ids[:seq.num_prompt_tokens], params.skip_special_tokens)
        n_out = seq.num_output_tokens
        may_stop = n_out >= params.min_tokens
        if may_stop and token in seq.request.eos_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", None
            seq.text += seq.detokenizer.flush()
            return
        if may_stop and params.stop_token_ids and token in params.stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token
            seq.text += seq.detokenizer.flush()
            return
        before = len(seq.text)
        seq.text += seq.detokenizer.add(token)
        last = n_out >= seq.request.max_tokens or seq.num_tokens >= self.max_model_len
        if last:
            seq.text += seq.detokenizer.flush()
        if params.stop_strings and may_stop and len(seq.text) > before:
            longest = max(len(s) for s in params.stop_strings)
            window_start = max(0, before - longest + 1)
            hits = [(seq.text.find(s, window_start), s) for s in params.stop_strings]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                index, stop = min(hits)
                end = index + len(stop) if params.include_stop_str_in_output else index
                seq.text = seq.text[:end]
                seq.finish_reason, seq.stop_reason = "stop", stop
                return
        if last:
            seq.finish_reason = "length"

    def releasable_text(self, seq: Sequence) -> str:
        """Text a stream may show now: all of it when finished, otherwise minus a tail
        that could still turn out to be the start of a stop string."""
        stops = seq.request.params.stop_strings
        if seq.finish_reason is not None or not stops:
            return seq.text
        hold = max(len(s) for s in stops) - 1
        return seq.text[:max(0, len(seq.text) - hold)] if hold else seq.text

    def _output(self, request: Request) -> RequestOutput:
        outputs = [
            CompletionOutput(
                index=s.index, text=self.releasable_text(s), token_ids=s.output_token_ids,
                cumulative_logprob=s.cumulative_logprob if s.logprobs is not None else None,
                logprobs=s.logprobs, finish_reason=s.finish_reason, stop_reason=s.stop_reason)
            for s in sorted(request.seqs, key=lambda s: s.index)
        ]
        return RequestOutput(
            request_id=request.request_id, prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids, prompt_logprobs=request.prompt_logprobs,
            outputs=outputs, finished=request.finished, metrics=request.metrics,
            num_cached_tokens=request.metrics.num_cached_tokens if request.metrics else 0)

    def _record_step(self, result: StepResult, seconds: float) -> None:
        s = self.stats
        s.steps += 1
        s.forward_seconds += result.forward_seconds
        s.sample_seconds += result.sample_seconds
        s.prepare_seconds += result.prepare_seconds
        s.step_seconds += seconds
