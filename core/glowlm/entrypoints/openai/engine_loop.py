"""The async engine driver: one asyncio task steps the engine for every HTTP request.

Threading contract. :class:`~glowlm.engine.llm_engine.LLMEngine` is
single-threaded: every engine call (add, abort, step) runs on one single-thread
executor, in submission order. The event loop only awaits those calls, so it
keeps accepting connections and streaming while a step runs, and an add or abort
submitted during a step runs right after it.

Tokenizing prompts, rendering chat templates and decoding for ``/detokenize``
or echo run on a second single-thread executor with the server's own copy of
the tokenizer (Hugging Face fast tokenizers may fail with "Already borrowed"
when one object is used from two threads; the engine keeps its copy for
incremental detokenization). A long prompt then costs its sender, on that
thread (the Rust tokenizer releases the GIL), and never delays the next step.

After every engine call the engine thread also takes an
:class:`~glowlm.entrypoints.openai.metrics.EngineSnapshot` and drains the
engine's latency lists (which would otherwise grow for the server's lifetime),
so ``/metrics`` never reads the engine itself.

Aborts are submitted without being awaited: they are issued from ``finally``
blocks of cancelled tasks (a client that disconnected), where anyio's cancel
scopes would cancel any ``await``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from glowlm.engine.llm_engine import LLMEngine
from glowlm.engine.outputs import PositionLogprobs, RequestOutput
from glowlm.entrypoints.openai.metrics import EngineSnapshot, ServerMetrics, SpecDecodeFigures
from glowlm.errors import LoRAError, RequestError
from glowlm.logger import init_logger
from glowlm.lora.request import LoRARequest
from glowlm.sampling.params import SamplingParams

logger = init_logger(__name__)

T = TypeVar("T")


def engine_thread() -> ThreadPoolExecutor:
    """The single thread every engine call runs on."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="glowlm-engine")


def front_tokenizer(tokenizer: Any) -> Any:
    """The server's own copy of the engine's tokenizer (one object per thread)."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception as exc:  # noqa: BLE001 - any tokenizer class may refuse to copy
        logger.warning("cannot copy the tokenizer (%r); the server shares the engine's, on "
                       "the engine thread", exc)
        return None


def longest_token_chars(tokenizer: Any) -> int:
    """Characters in the vocabulary's longest token string (byte-level BPE spells a byte
    as one character, so this bounds the input characters any one token covers)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: no bound
        return 0
    return max((len(t) for t in vocab), default=0)


class EngineFailure(RuntimeError):
    """The engine raised while stepping; the requests in flight were aborted."""


class RequestsCancelled(Exception):
    """Delivered to a group whose requests were aborted (server shutting down)."""


class RequestGroup:
    """The engine requests behind one HTTP request, sharing one output queue.

    Iterate it to receive every :class:`RequestOutput` of its requests until all
    have finished. :meth:`close` aborts whatever has not finished; call it in a
    ``finally`` so a failed or abandoned HTTP request never leaves work behind.
    """

    def __init__(self, driver: AsyncEngine) -> None:
        self._driver = driver
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.pending: set[str] = set()

    async def add(self, request_id: str, prompt: str | list[int] | dict[str, Any],
                  params: SamplingParams, lora_request: LoRARequest | None = None) -> None:
        """Queue one request (on ``lora_request``'s adapter, if given); raises
        RequestError (nothing queued) if it is invalid, LoRAError if the adapter was
        unloaded since the caller looked its name up."""
        driver = self._driver
        self.pending.add(request_id)  # first: close() must abort it even if we are cancelled
        driver.streams[request_id] = self.queue
        driver.adds_in_flight += 1
        try:
            await driver.run(driver.add_in_thread, request_id, prompt, params, lora_request)
        except RequestError:
            self.pending.discard(request_id)  # nothing was queued
            driver.streams.pop(request_id, None)
            raise
        finally:
            driver.adds_in_flight -= 1
        driver.wake()

    def __aiter__(self) -> RequestGroup:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.pending:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.pending.clear()
            raise item
        if item.finished:
            self.pending.discard(item.request_id)
            self._driver.streams.pop(item.request_id, None)
        return item

    def cancel(self, reason: BaseException | None = None) -> None:
        """Abort everything and make iteration end (or raise ``reason``)."""
        self.close()
        self.queue.put_nowait(reason or RequestsCancelled("the request was cancelled"))

    def close(self) -> None:
        for request_id in self.pending:
            self._driver.abort(request_id)
        self.pending.clear()


class AsyncEngine:
    """Owns the engine thread and the stepping task; shared by all HTTP requests."""

    def __init__(self, engine: LLMEngine, metrics: ServerMetrics, max_queue: int | None = None,
                 executor: ThreadPoolExecutor | None = None) -> None:
        """``executor``: the single thread that built the engine (and holds its thread
        binding); a new one is made if not given."""
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self.snapshot = EngineSnapshot()
        self._executor = executor or engine_thread()
        copied = front_tokenizer(engine.tokenizer)
        #: The tokenizer the server uses, on :attr:`_tok_executor` only.
        self.tokenizer = copied if copied is not None else engine.tokenizer
        self._tok_executor = (ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="glowlm-tokenizer")
                              if copied is not None else self._executor)
        #: At most this many characters per token (0: unknown); see check_prompt_chars.
        self.max_token_chars = longest_token_chars(self.tokenizer)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        #: Adds submitted to the engine thread but not yet done (touched on the loop only).
        self.adds_in_flight = 0
        self._token_text: dict[int, str] = {}
        self._closed = False
        #: The event loop the driver runs on (set by start; for signal handlers).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.snapshot = self._snapshot()  # engine idle: safe from this thread

    # -- lifecycle (event loop) ---------------------------------------------------------

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="glowlm-engine-loop")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def cancel_all(self, reason: str) -> None:
        """End every request now: its HTTP handler gets RequestsCancelled(reason)."""
        queues = {id(q): q for q in self.streams.values()}
        for _ in self.streams:
            self.metrics.count_finished("abort")
        self.streams.clear()
        for queue in queues.values():
            queue.put_nowait(RequestsCancelled(reason))
        if not self._closed:
            with contextlib.suppress(RuntimeError):
                self._executor.submit(self._abort_all_in_thread)

    async def shutdown(self) -> None:
        """Abort what is left, stop stepping, and let the engine thread finish."""
        self.cancel_all("the server is shutting down")
        with contextlib.suppress(Exception):
            await self.run(self._abort_all_in_thread)
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._executor.shutdown(wait=True)
        self._tok_executor.shutdown(wait=False, cancel_futures=True)

    # -- calls into the engine thread ---------------------------------------------------

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread (serialized with every engine call)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run_tokenizer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the tokenizer thread (it may use :attr:`tokenizer`)."""
        return await asyncio.get_running_loop().run_in_executor(self._tok_executor, fn, *args)

    def group(self) -> RequestGroup:
        return RequestGroup(self)

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def abort(self, request_id: str) -> None:
        """Abort without waiting (usable from cancelled tasks); unknown ids are ignored."""
        self.streams.pop(request_id, None)
        if not self._closed:
            self.metrics.count_finished("abort")
            with contextlib.suppress(RuntimeError):  # executor already shut down
                self._executor.submit(self._abort_in_thread, request_id)

    @property
    def num_waiting(self) -> int:
        """Requests queued but not yet running, counting adds not yet in the snapshot."""
        return self.snapshot.num_waiting + self.adds_in_flight

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenizer thread only."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_texts(self, token_ids: list[int], tokenizer: Any = None) -> list[str]:
        """Each token decoded alone (cached; used for logprobs). Tokenizer thread, or the
        engine thread with ``tokenizer=engine.tokenizer``."""
        tok = self.tokenizer if tokenizer is None else tokenizer
        out = []
        for t in token_ids:
            text = self._token_text.get(t)
            if text is None:
                text = tok.decode([t], skip_special_tokens=False)
                self._token_text[t] = text
            out.append(text)
        return out

    # -- engine-thread bodies -----------------------------------------------------------

    def add_in_thread(self, request_id: str, prompt: Any, params: SamplingParams,
                      lora_request: LoRARequest | None = None) -> None:
        try:
            if lora_request is None:
                self.engine.add_request(request_id, prompt, params)
            else:
                # Checked here, serialized with unloads (also engine-thread calls): an
                # adapter unloaded after the front-end resolved its name must not come
                # back, which engine.add_request would do by registering it again.
                if lora_request not in self.engine.list_loras():
                    raise LoRAError(f"the LoRA adapter {lora_request.lora_name!r} was "
                                    "unloaded")
                self.engine.add_request(request_id, prompt, params,
                                        lora_request=lora_request)
        finally:
            self.snapshot = self._snapshot()

    def _abort_in_thread(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self.snapshot = self._snapshot()

    def _abort_all_in_thread(self) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
        self.snapshot = self._snapshot()

    def _step_in_thread(self) -> tuple[list[RequestOutput], dict[str, list[float]]]:
        try:
            outputs = self.engine.step()
            for out in outputs:
                if isinstance(out, RequestOutput):  # pooling outputs carry no logprobs
                    self._decode_logprobs(out)
        finally:
            self.snapshot = self._snapshot()
        lat = self.engine.stats.latencies
        samples = {kind: list(values) for kind, values in lat.items()}
        for values in lat.values():
            values.clear()
        return outputs, samples

    def _decode_logprobs(self, out: RequestOutput) -> None:
        """Fill ``decoded_token`` of new logprob entries (newest first, stop at decoded)."""
        lists: list[list[PositionLogprobs | None]] = [
            o.logprobs for o in out.outputs if o.logprobs]  # type: ignore[misc]
        if out.prompt_logprobs:
            lists.append(out.prompt_logprobs)
        for positions in lists:
            for entry in reversed(positions):
                if entry is None:
                    continue
                if all(lp.decoded_token is not None for lp in entry.values()):
                    break
                ids = list(entry)
                texts = self.token_texts(ids, self.engine.tokenizer)
                for lp, text in zip(entry.values(), texts, strict=True):
                    lp.decoded_token = text

    def _snapshot(self) -> EngineSnapshot:
        e = self.engine
        speculator = getattr(e, "speculator", None)  # a data-parallel engine has none
        spec = None
        if speculator is not None:
            st = speculator.stats
            spec = SpecDecodeFigures(st.num_drafts, st.num_draft_tokens,
                                     st.num_accepted_tokens, tuple(st.accepted_per_pos))
        bm = getattr(e, "block_manager", None)
        if bm is None:  # the pooling engine keeps no KV cache between steps
            return EngineSnapshot(
                num_running=e.num_running, num_waiting=e.num_waiting,
                num_unfinished=len(e.requests), prompt_tokens=e.stats.prompt_tokens,
                generation_tokens=e.stats.generation_tokens)
        return EngineSnapshot(
            num_running=e.num_running, num_waiting=e.num_waiting,
            num_unfinished=len(e.requests), num_blocks=bm.num_blocks,
            num_free_blocks=bm.num_free_blocks, kv_cache_usage=bm.usage(),
            prefix_cache_queries=bm.stats.queries, prefix_cache_hits=bm.stats.hits,
            prompt_tokens=e.stats.prompt_tokens, generation_tokens=e.stats.generation_tokens,
            num_preemptions=e.scheduler.num_preemptions, spec_decode=spec)

    # -- the stepping task --------------------------------------------------------------

    async def _loop(self) -> None:
        """Step while there is work. Step N+1 is submitted before step N's outputs are
        handed out, so formatting and sending them (on the event loop) overlaps the
        next step's compute instead of adding to every inter-token latency."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            pending: asyncio.Future[Any] | None = None
            while pending is not None or self.snapshot.num_unfinished:
                if pending is None:
                    pending = loop.run_in_executor(self._executor, self._step_in_thread)
                try:
                    outputs, samples = await pending
                except Exception as exc:  # noqa: BLE001 - a bug must not hang every client
                    logger.exception("engine step failed; aborting the requests in flight")
                    self._fail_all(EngineFailure(f"the engine failed: {exc!r}"))
                    pending = None
                    continue
                snap = self.snapshot
                # A pooling engine's requests wait until a step runs them (none stays
                # running), so its next step is due whenever any is unfinished.
                busy = snap.num_running or getattr(self.engine, "is_pooling", False)
                pending = (loop.run_in_executor(self._executor, self._step_in_thread)
                           if snap.num_unfinished and busy else None)
                self.metrics.observe(samples)
                self._dispatch(outputs)
                if pending is None and snap.num_unfinished:
                    await asyncio.sleep(0.002)  # nothing fits yet: do not spin
                else:
                    await asyncio.sleep(0)  # let handlers run

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if out.finished and not isinstance(out, RequestOutput):
                self.metrics.count_finished("stop")  # a pooling request: one pass, done
            elif out.finished and out.outputs:
                self.metrics.count_finished(out.outputs[0].finish_reason or "abort")
            queue = self.streams.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def _fail_all(self, exc: BaseException) -> None:
        for request_id, queue in list(self.streams.items()):
            queue.put_nowait(exc)
            self.abort(request_id)
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._abort_all_in_thread)
