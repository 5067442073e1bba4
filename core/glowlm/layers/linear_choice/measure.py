"""Timing the candidates of one linear shape at one token class's row count.

One warm-up call (which also checks the output against the incumbent's) and, where
the pass covers more layers than that call, one untimed pass; then at most
:data:`REPEATS` timed passes over up to a few layers of the shape. The best pass
counts, and the incumbent (the first candidate) keeps the shape unless another is
faster by more than :data:`MARGIN` (:data:`FUSED_MARGIN` more when the incumbent is
the kernel the platform's fused ops run).

Passes are kept few (a candidate's first call, which makes its weight copy, is
most of the rest of the cost): a loser stops after one pass when it is
:data:`DROP_AFTER_ONE` times the best so far (no descheduled thread doubles a pass of
many milliseconds), after two when it is 50 % behind, and any candidate once
:data:`MEASURE_SECONDS` of passes are spent (compute-bound prefill passes of 40-80 ms
vary by ~1 %, so two of them decide).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from glowlm.logger import init_logger
from glowlm.ops.linear import LinearCandidate

logger = init_logger("glowlm.layers.linear_choice")

#: The incumbent keeps a shape unless another candidate is this much faster (noise guard).
MARGIN = 0.05
#: More, where the incumbent is ``fused``: a layer that leaves it switches the fused
#: stack off for that token class, which costs the Python between kernels the stack
#: saves (~3 % of a decode step, docs/kernels.md). A Zen 4 guest's bf16 decode showed it:
#: the block-packed GEMM tied glowlm's GEMV at one row, won one shape by noise, and the
#: stack went off for the whole model.
FUSED_MARGIN = 0.05
#: Timed passes per candidate (after one warm-up), fewer when it is already losing.
REPEATS = 5
#: Past this many seconds of timed passes a candidate stops (after at least two).
MEASURE_SECONDS = 0.06
#: A candidate whose first timed pass takes this many times the best so far stops there.
DROP_AFTER_ONE = 2.0
#: Relative L2 error above which a candidate's output is called wrong (bf16 kernels
#: differ from each other by ~1e-3 in accumulation order).
MAX_REL_ERROR = 2e-2


@dataclass
class Measurement:
    """One shape and class: the winner and every candidate's time per call (µs)."""

    winner: str
    us: dict[str, float | None]     # None: skipped (raised or wrong output)


def _timed_pass(cand: LinearCandidate, layers: Sequence[nn.Module], x: torch.Tensor,
                clock: Callable[[], float]) -> tuple[float, torch.Tensor]:
    start = clock()
    y = None
    for layer in layers:
        y = cand.apply(layer, x, getattr(layer, "bias", None))
    assert y is not None
    return clock() - start, y


def measure(candidates: Sequence[LinearCandidate], layers: Sequence[nn.Module],
            in_features: int, dtype: torch.dtype, rows: int, warned: set[str],
            label: str = "", clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time each candidate over ``layers`` at ``rows`` rows; the fastest (incumbent
    kept within :data:`MARGIN`). Skipped candidates are warned about once per process
    (``warned`` holds their names). ``clock``: seconds, as ``time.perf_counter``."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=g).to(dtype)
    reference: torch.Tensor | None = None
    us: dict[str, float | None] = {}
    best = float("inf")
    for i, cand in enumerate(candidates):
        try:
            with torch.inference_mode():
                _, y = _timed_pass(cand, layers[:1], x, clock)      # warm-up and output check
                if reference is None:
                    reference = y.float()
                else:
                    err = float((y.float() - reference).norm() / reference.norm().clamp_min(1e-30))
                    if not err <= MAX_REL_ERROR:
                        raise ValueError(f"its output differs from {candidates[0].name}'s "
                                         f"(relative error {err:.2g})")
                if len(layers) > 1:                 # the other layers' first call
                    _timed_pass(cand, layers, x, clock)
                times: list[float] = []
                while len(times) < REPEATS:
                    t, _ = _timed_pass(cand, layers, x, clock)
                    times.append(t)
                    # A descheduled OpenMP thread costs a pass tens of ms on a shared
                    # host, so one slow pass proves little: after one pass only a
                    # candidate at DROP_AFTER_ONE times the best stops; otherwise its
                    # best of two must be clearly behind, or its time spent.
                    if len(times) == 1 and t > DROP_AFTER_ONE * best * len(layers):
                        break
                    if len(times) >= 2 and (min(times) > 1.5 * best * len(layers)
                                            or sum(times) > MEASURE_SECONDS):
                        break
        except Exception as exc:  # noqa: BLE001 - a broken candidate is skipped, not fatal
            if i == 0:
                raise
            us[cand.name] = None
            if cand.name not in warned:
                warned.add(cand.name)
                logger.warning("linear candidate %r skipped (%s): %s: %s", cand.name, label,
                               type(exc).__name__, exc)
            continue
        per_call = min(times) / len(layers)
        us[cand.name] = per_call * 1e6
        best = min(best, per_call)
    incumbent = us[candidates[0].name]
    assert incumbent is not None
    winner = min((n for n, t in us.items() if t is not None), key=lambda n: us[n])  # type: ignore[arg-type,return-value]
    margin = MARGIN + (FUSED_MARGIN if candidates[0].fused else 0.0)
    if us[winner] >= incumbent * (1 - margin):  # type: ignore[operator]
        winner = candidates[0].name
    return Measurement(winner, us)
