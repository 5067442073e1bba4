"""One rank process (1..world-1): bind, plan, load its shard, then run steps until told.

The entry point of a ``spawn``-ed rank (see :mod:`glowlm.executor.executor`),
started by the driver on its host or by a headless node on another
(:mod:`glowlm.executor.node`).
Its log lines carry ``(rank N)``; errors go back to the driver over the pipe, so
the user sees one line naming the rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import traceback
from typing import Any

from glowlm.distributed.gloo import init_gloo
from glowlm.distributed.groups import Layout, RankComms
from glowlm.distributed.shm import RankFailure
from glowlm.errors import GlowlmError

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this rank when the driver's process goes (Linux); no orphans after a kill -9."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the driver died before prctl took effect
        os._exit(1)


class WorkerLink:
    """A rank's side of the start-up handshake (the driver's is the Executor)."""

    def __init__(self, conn: Any, comms: RankComms, tp: int, pp: int) -> None:
        self.conn, self.comms = conn, comms
        self.rank = comms.rank
        self.parallel = comms.state(tp, pp)

    def _expect(self, tag: str) -> Any:
        got, value = self.conn.recv()
        if got != tag:
            raise GlowlmError(f"rank {self.rank}: expected {tag!r} from the driver, got {got!r}")
        return value

    def planned(self) -> None:
        self.conn.send(("planned", None))
        self._expect("load")

    def agree_blocks(self, local: int) -> int:
        self.conn.send(("loaded", local))
        return int(self._expect("blocks"))


def worker_main(config: Any, layout: Layout, rank: int, conn: Any, addr: str, port: int,
                parent: int | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    _die_with_parent(parent if parent is not None else os.getppid())
    # tqdm's default lock is a multiprocessing semaphore, leaked when a rank is killed.
    with contextlib.suppress(Exception):
        import threading

        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
    root = logging.getLogger("glowlm")
    from glowlm.logger import init_logger

    init_logger(__name__)
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter(f"%(levelname)s glowlm (rank {rank}): "
                                               "%(message)s"))
    try:
        from glowlm.engine.model_runner import ModelRunner
        from glowlm.engine.setup import build_engine_parts

        comms = RankComms(layout, rank)
        link = WorkerLink(conn, comms, layout.tp, layout.pp)
        setup = build_engine_parts(config, show_progress=False, link=link)
        runner = ModelRunner(setup.model, setup.parts.attention_backend, setup.num_blocks,
                             setup.config.block_size, setup.kv_dtype or setup.parts.dtype,
                             parallel=link.parallel, comms=comms, lora_state=setup.parts.lora)
        init_gloo(rank, layout.tp * layout.pp, addr, port)
        comms.connect()  # the groups that span hosts
        conn.send(("gloo", None))
    except RankFailure:
        os._exit(1)
    except GlowlmError as exc:
        with contextlib.suppress(Exception):
            conn.send(("error", str(exc)))
        os._exit(2)
    except BaseException as exc:  # noqa: BLE001 - report anything, then die
        traceback.print_exc(file=sys.stderr)
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    try:
        runner.worker_loop()
    except RankFailure:
        os._exit(1)
    except BaseException:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        os._exit(1)
    os._exit(0)
