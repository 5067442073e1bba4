"""Data parallelism behind one API server: N engine replicas, one front-end.

``glowlm serve -dp N`` builds a :class:`DPEngine` instead of an in-process
:class:`~glowlm.engine.llm_engine.LLMEngine`. It has the engine's interface as the
server's engine loop uses it (``add_request``, ``abort_request``, ``step``,
``requests``, ``stats``, the block-manager and scheduler figures for ``/metrics``),
so the server itself is unchanged. Each replica is a ``spawn``-ed process with its
own full engine (and, with ``-tp``/``-pp``, its own rank processes), bound to its
slice of the machine: replica ``d`` of world size ``W`` is ranks ``d*W .. d*W+W-1``
of the binding plan, so with ``auto`` every rank gets its own NUMA node and an
explicit ``GLOWLM_CPU_OMP_THREADS_BIND`` gives one ``|`` list per rank of every
replica, in replica order.

Balancing: a new request goes to the live replica with the least outstanding work,
counted as the tokens its unfinished requests may still compute (prompt + max_tokens
of each). Replicas step on their own whenever they have work and push every step's
outputs and figures over their pipe; :meth:`DPEngine.step` collects what arrived.

A replica that dies is logged once, its requests finish with ``finish_reason
"abort"`` (the client gets a complete response, not a hang), new requests go to the
others, and :attr:`DPEngine.dead_replicas` makes ``/health`` answer 503.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from glowlm.engine.llm_engine import EngineStats
from glowlm.engine.outputs import CompletionOutput, RequestOutput
from glowlm.errors import GlowlmError, RequestError
from glowlm.logger import init_logger

logger = init_logger(__name__)

#: How long one :meth:`DPEngine.step` waits for a replica's outputs when none are queued.
STEP_WAIT_SECONDS = 0.02


@dataclass
class _BlockStats:
    queries: int = 0
    hits: int = 0


@dataclass
class _Blocks:
    """The block-manager figures ``/metrics`` reads, summed over replicas."""

    num_blocks: int = 0
    num_free_blocks: int = 0
    stats: _BlockStats = field(default_factory=_BlockStats)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0


@dataclass
class _Scheduler:
    num_preemptions: int = 0


@dataclass
class _Stats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    #: The same kinds as the engine's own (EngineStats).
    latencies: dict[str, deque[float]] = field(
        default_factory=lambda: EngineStats().latencies)


@dataclass
class _Replica:
    index: int
    proc: Any
    conn: Any
    figures: dict[str, int] = field(default_factory=dict)
    outstanding: dict[str, int] = field(default_factory=dict)  # request id -> token budget
    dead: str | None = None


def _figures(engine: Any) -> dict[str, int]:
    bm = engine.block_manager
    return {"num_running": engine.num_running, "num_waiting": engine.num_waiting,
            "num_blocks": bm.num_blocks, "num_free_blocks": bm.num_free_blocks,
            "queries": bm.stats.queries, "hits": bm.stats.hits,
            "prompt_tokens": engine.stats.prompt_tokens,
            "generation_tokens": engine.stats.generation_tokens,
            "num_preemptions": engine.scheduler.num_preemptions}


def replica_main(config: Any, index: int, conn: Any) -> None:
    """One replica: build the engine, then serve add/abort commands and step."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from glowlm.executor.worker import _die_with_parent

    _die_with_parent(os.getppid())
    import logging

    init_logger(__name__)
    for handler in logging.getLogger("glowlm").handlers:
        handler.setFormatter(logging.Formatter(f"%(levelname)s glowlm (replica {index}): "
                                               "%(message)s"))
    try:
        from glowlm.engine.llm_engine import LLMEngine
        from glowlm.executor import start_ranks

        engine = LLMEngine(config, show_progress=False, ranks=start_ranks)
    except BaseException as exc:  # noqa: BLE001 - report, then die
        msg = str(exc) if isinstance(exc, GlowlmError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            conn.send(("error", msg))
        os._exit(2)
    conn.send(("ready", {"max_model_len": engine.max_model_len,
                         "vocab_size": engine.vocab_size, **_figures(engine)}))
    try:
        while True:
            while conn.poll(0 if engine.has_unfinished_requests() else None):
                cmd = conn.recv()
                if cmd[0] == "add":
                    try:
                        engine.add_request(cmd[1], cmd[2], cmd[3])
                        conn.send(("added", None))
                    except GlowlmError as exc:
                        conn.send(("refused", (type(exc).__name__, str(exc))))
                elif cmd[0] == "abort":
                    engine.abort_request(cmd[1])
                elif cmd[0] == "stop":
                    engine.shutdown()
                    os._exit(0)
            if engine.has_unfinished_requests():
                outputs = engine.step()
                lat = {k: list(v) for k, v in engine.stats.latencies.items()}
                for v in engine.stats.latencies.values():
                    v.clear()
                conn.send(("step", outputs, _figures(engine), lat))
    except (EOFError, BrokenPipeError):  # the front-end is gone
        engine.shutdown()
        os._exit(0)
    except BaseException:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        engine.shutdown()
        os._exit(1)


class DPEngine:
    """``data_parallel_size`` replicas of the engine, seen by the server as one."""

    def __init__(self, config: Any) -> None:
        from glowlm.engine.setup import load_tokenizer
        from glowlm.model_loader.loader import read_model_dir

        self.dp = config.data_parallel_size
        # The server admits requests against the replicas' sequences together.
        self.config = dataclasses.replace(config, max_num_seqs=config.max_num_seqs * self.dp)
        self.requests: dict[str, int] = {}  # request id -> replica index
        self.stats = _Stats()
        self.block_manager = _Blocks()
        self.scheduler = _Scheduler()
        self.replicas: list[_Replica] = []
        self._finished_outputs: list[RequestOutput] = []
        ctx = mp.get_context("spawn")
        try:
            for d in range(self.dp):
                parent, child = ctx.Pipe()
                replica_config = dataclasses.replace(config, data_parallel_rank=d)
                proc = ctx.Process(target=replica_main, args=(replica_config, d, child),
                                   name=f"glowlm-dp{d}", daemon=True)
                proc.start()
                child.close()
                self.replicas.append(_Replica(d, proc, parent))
            logger.info("started %d data-parallel replica(s): pids %s", self.dp,
                        ", ".join(str(r.proc.pid) for r in self.replicas))
            infos = [self._expect_ready(r) for r in self.replicas]
        except BaseException:
            self.shutdown()
            raise
        self.max_model_len = min(i["max_model_len"] for i in infos)
        self.vocab_size = infos[0]["vocab_size"]
        info = read_model_dir(config.model, config.revision, config.gguf_file,
                              hf_overrides=config.hf_overrides)
        self.model_info = info
        self.eos_token_ids = frozenset(info.eos_token_ids)
        self.tokenizer = load_tokenizer(config.tokenizer or str(info.path))
        for r, i in zip(self.replicas, infos, strict=True):
            r.figures = i
        self._aggregate()
        import atexit

        atexit.register(self.shutdown)

    def _expect_ready(self, r: _Replica) -> dict[str, int]:
        ready = mpc.wait([r.conn, r.proc.sentinel])
        if r.conn in ready:
            with contextlib.suppress(EOFError):
                tag, value = r.conn.recv()
                if tag == "ready":
                    return value
                raise GlowlmError(f"data-parallel replica {r.index}: {value}")
        r.proc.join(1)
        raise GlowlmError(f"data-parallel replica {r.index} (pid {r.proc.pid}) exited with "
                          f"code {r.proc.exitcode} during start-up")

    # -- what the server reads ----------------------------------------------------------

    @property
    def dead_replicas(self) -> list[str]:
        return [r.dead for r in self.replicas if r.dead]

    @property
    def num_running(self) -> int:
        return sum(r.figures.get("num_running", 0) for r in self.replicas if not r.dead)

    @property
    def num_waiting(self) -> int:
        return sum(r.figures.get("num_waiting", 0) for r in self.replicas if not r.dead)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def _aggregate(self) -> None:
        live = [r.figures for r in self.replicas if not r.dead]
        bm = self.block_manager
        bm.num_blocks = sum(f.get("num_blocks", 0) for f in live)
        bm.num_free_blocks = sum(f.get("num_free_blocks", 0) for f in live)
        every = [r.figures for r in self.replicas]  # counters keep what dead ones did
        bm.stats.queries = sum(f.get("queries", 0) for f in every)
        bm.stats.hits = sum(f.get("hits", 0) for f in every)
        self.stats.prompt_tokens = sum(f.get("prompt_tokens", 0) for f in every)
        self.stats.generation_tokens = sum(f.get("generation_tokens", 0) for f in every)
        self.scheduler.num_preemptions = sum(f.get("num_preemptions", 0) for f in every)

    # -- requests -----------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: Any, params: Any = None) -> None:
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        live = [r for r in self.replicas if not r.dead]
        if not live:
            raise GlowlmError("every data-parallel replica has died: "
                              + "; ".join(self.dead_replicas))
        replica = min(live, key=lambda r: (sum(r.outstanding.values()), r.index))
        try:
            replica.conn.send(("add", request_id, prompt, params))
            msg = replica.conn.recv()
            while msg[0] == "step":  # outputs that were on the way: keep them for step()
                self._take(replica, msg[1], msg[2], msg[3])
                msg = replica.conn.recv()
            tag, value = msg
        except (EOFError, BrokenPipeError, OSError):
            self._mark_dead(replica)
            return self.add_request(request_id, prompt, params)
        if tag == "refused":
            kind, msg = value
            raise RequestError(msg) if kind == "RequestError" else GlowlmError(msg)
        tokens = len(prompt) if isinstance(prompt, list) else 0
        budget = tokens + int(getattr(params, "max_tokens", None) or self.max_model_len)
        replica.outstanding[request_id] = budget
        self.requests[request_id] = replica.index
        return None

    def abort_request(self, request_id: str) -> None:
        index = self.requests.pop(request_id, None)
        if index is None:
            return
        replica = self.replicas[index]
        replica.outstanding.pop(request_id, None)
        if not replica.dead:
            with contextlib.suppress(Exception):
                replica.conn.send(("abort", request_id))

    # -- stepping -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """The outputs every replica produced since the last call (waits a little for
        the first one when none are queued)."""
        conns = {r.conn: r for r in self.replicas if not r.dead}
        sentinels = {r.proc.sentinel: r for r in self.replicas if not r.dead}
        ready = mpc.wait(list(conns) + list(sentinels),
                         timeout=0 if self._finished_outputs else STEP_WAIT_SECONDS)
        for obj in ready:
            if obj in conns:
                r = conns[obj]
                try:
                    while r.conn.poll():
                        msg = r.conn.recv()
                        if msg[0] == "step":
                            self._take(r, msg[1], msg[2], msg[3])
                except (EOFError, OSError):
                    self._mark_dead(r)
            elif not sentinels[obj].dead:
                self._mark_dead(sentinels[obj])
        self._aggregate()
        out, self._finished_outputs = self._finished_outputs, []
        return out

    def _take(self, r: _Replica, outputs: list[RequestOutput], figures: dict[str, int],
              latencies: dict[str, list[float]]) -> None:
        r.figures = figures
        for kind, values in latencies.items():
            self.stats.latencies.setdefault(kind, deque(maxlen=100_000)).extend(values)
        for o in outputs:
            if o.request_id not in self.requests:
                continue  # aborted meanwhile
            self._finished_outputs.append(o)
            if o.finished:
                self.requests.pop(o.request_id, None)
                r.outstanding.pop(o.request_id, None)

    def _mark_dead(self, r: _Replica) -> None:
        if r.dead:
            return
        r.proc.join(0.5)
        code = r.proc.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        r.dead = f"replica {r.index} (pid {r.proc.pid}) {how}"
        lost = [rid for rid, index in self.requests.items() if index == r.index]
        logger.error("data-parallel %s; its %d request(s) end with finish_reason 'abort', "
                     "new requests go to the other replicas", r.dead, len(lost))
        for rid in lost:
            self.requests.pop(rid, None)
            self._finished_outputs.append(RequestOutput(
                request_id=rid, prompt=None, prompt_token_ids=[], prompt_logprobs=None,
                outputs=[CompletionOutput(index=0, text="", token_ids=[],
                                          finish_reason="abort")], finished=True))
        r.outstanding.clear()

    def shutdown(self) -> None:
        for r in self.replicas:
            with contextlib.suppress(Exception):
                r.conn.send(("stop",))
        for r in self.replicas:
            r.proc.join(5)
            if r.proc.is_alive():
                r.proc.kill()
                r.proc.join(1)
