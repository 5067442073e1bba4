"""How a download shows its progress: one bar on a terminal, log lines elsewhere.

snapshot_download draws three bars (files fetched, network bytes, bytes written);
glowlm hands it a ``tqdm_class`` that keeps all three working (their state is
huggingface_hub's business) but draws only the bytes-written one, labelled with the
model, and only on a terminal. When stderr is not a terminal (``glowlm serve`` under a
service manager, in a container, in a test's log file) a bar is a stream of carriage
returns, so the same progress becomes a log line every :data:`LOG_EVERY_S` seconds and
one when the download ends. ``HF_HUB_DISABLE_PROGRESS_BARS=1`` silences both.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from glowlm import envs
from glowlm.logger import init_logger

logger = init_logger(__name__)

#: Seconds between two progress log lines when stderr is not a terminal.
LOG_EVERY_S = 10.0


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


@contextmanager
def download_progress(label: str, per_file: bool = False) -> Iterator[type]:
    """A ``tqdm_class`` for one snapshot_download call (``per_file``: for hf_hub_download
    calls, one bar per file); its bars close on exit and, if bytes came in, one line
    says how many and how fast."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    tty = sys.stderr.isatty()
    quiet = not envs.hub().progress_bars
    opened: list[Any] = []
    start = time.monotonic()

    class DownloadBar(hf_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            desc = str(kwargs.get("desc", ""))
            self._bytes = per_file or desc.startswith("Reconstruct")
            self._draws = self._bytes and tty and not quiet
            self._last_log = time.monotonic()
            if kwargs.get("disable") is None:
                kwargs["disable"] = False
            if self._draws:
                kwargs.update(
                    desc=f"{label} {desc}" if per_file else label, position=0, file=sys.stderr
                )
            else:
                kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
            self._devnull = None if self._draws else kwargs["file"]
            super().__init__(*args, **kwargs)
            opened.append(self)

        def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
            if not self._draws:  # keep the model's name on the bar that shows
                super().set_description(desc, refresh)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            now = time.monotonic()
            if self._bytes and not tty and not quiet and now - self._last_log >= LOG_EVERY_S:
                self._last_log = now
                total = self.total or 0
                logger.info(
                    "%s: %s of %s (%.0f%%)",
                    label,
                    _mb(self.n),
                    _mb(total),
                    100 * self.n / total if total else 0,
                )
            return shown

        def close(self) -> None:
            super().close()
            if getattr(self, "_devnull", None) is not None:
                self._devnull.close()
                self._devnull = None

    finished = False
    try:
        yield DownloadBar
        finished = True
    finally:
        counted = [bar.n for bar in opened if bar._bytes]
        done = sum(counted) if per_file else max(counted, default=0)
        for bar in opened:
            bar.close()
        if done and finished:
            elapsed = max(time.monotonic() - start, 1e-3)
            logger.info(
                "%s: %s in %.1f s (%s/s)",
                label.replace("Downloading", "downloaded"),
                _mb(done),
                elapsed,
                _mb(done / elapsed),
            )
