"""The platform contract suite: any plugin's tests run it with their own platform.

Each check takes a :class:`~glowlm.platforms.interface.Platform` *instance* and one
dtype, builds the parts the platform hands the engine, and compares them with
core's references (:mod:`glowlm.ops.reference`, the reference attention backend,
``F.linear``), raising ``AssertionError`` with what differed:

- :func:`check_ops`: every op of the platform's :class:`~glowlm.ops.table.OpsTable`
  against the function of the same name in ``glowlm.ops.reference``;
- :func:`check_attention`: two engine-shaped steps (prefills, a chunk continuing a
  prefix, decodes) through the platform's attention backend, in its own cache
  layout, against the reference backend; :func:`check_attention_fp8` the same over
  8-bit float caches (``--kv-cache-dtype fp8`` / ``fp8_e5m2``), and
  :func:`check_attention_int8` over int8 caches with a scale per row;
- :func:`check_linear`: the unquantized linear method, decode and prefill shapes,
  against ``F.linear``;
- :func:`check_model`: a tiny seeded checkpoint end to end through the engine on
  this platform (its own linear method and its fused layer and stack ops: the
  measured linear choice is off), against the same engine on core's reference parts;
- :func:`check_linear_choice` (not in :data:`CHECKS`: it names the platform's op
  namespace): the same engine with the measured choice on, where the platform's compiled
  dense kernel must be timed on every dense shape and, pinned, run on every dense layer
  and the LM head (:mod:`.choice`).

One module per kind of check (:mod:`.ops`, :mod:`.attention`, :mod:`.model`,
:mod:`.fallback`, :mod:`.choice`; the tolerances and seeded tensors in :mod:`.common`); this package
holds the suite itself (:data:`CHECKS`, :func:`cases`, :func:`platform_for`) and
re-exports every check.

A plugin's test file is a few lines (examples/glowlm-example/tests/test_contract.py)::

    PLATFORM = contract.platform_for(MyChipPlatform)   # None: not this host

    @pytest.mark.skipif(PLATFORM is None, reason="MyChip does not run on this host")
    @pytest.mark.parametrize("check, dtype", contract.cases(PLATFORM), ids=contract.case_id)
    def test_contract(check, dtype):
        check(PLATFORM, dtype)

Tolerances: float32 results may differ from the reference by summation order
(1e-5 relative for ops, 1e-4 for GEMMs); bfloat16/float16 by one unit in the last
place of the output dtype (7.8e-3 and 9.8e-4 at 1.0) plus the accumulated order
differences of a GEMM (2e-2 and 2e-3). End to end, float32 must give the same
greedy tokens and log-probabilities within 1e-3; bfloat16/float16 the prompt's
log-probabilities within 0.1 nats on average (half precision rounds every layer's
activations; the tiny models' logits span tens of nats).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from glowlm.ops.table import REFERENCE_OPS
from glowlm.platforms.interface import Match, Platform, dtype_name
from glowlm.testing.contract.attention import (
    check_attention,
    check_attention_fp8,
    check_attention_int8,
    step_metadata,
)
from glowlm.testing.contract.choice import check_linear_choice
from glowlm.testing.contract.common import GEMM_TOL, TOL, Check
from glowlm.testing.contract.fallback import check_reference_fallback
from glowlm.testing.contract.model import check_model, check_model_layernorm, tiny_model
from glowlm.testing.contract.ops import check_linear, check_ops


def platform_for(cls: type[Platform], host: Any = None) -> Platform | None:
    """An instance of ``cls`` for ``host`` (default: this machine), None if it does not match.

    A recorded host (``glowlm.testing.hosts``) gives the platform that host would get;
    its parts still run on this CPU, so only use one whose kernels this CPU executes.
    """
    from glowlm.platforms.host import live

    host = host if host is not None else live()
    match = cls.detect(host)
    if not match.matched:
        return None
    return cls(host, Match(True, match.reason, match.isa))


#: Every check, in the order :func:`cases` yields them.
CHECKS: tuple[Check, ...] = (check_ops, check_attention, check_attention_fp8,
                             check_attention_int8, check_linear, check_model,
                             check_model_layernorm)


def cases(platform: Platform | None, dtypes: Iterable[torch.dtype] | None = None
          ) -> list[tuple[Check, torch.dtype]]:
    """``(check, dtype)`` for every check and every dtype the platform advertises
    (empty for ``None``, so a parametrized test of a platform that does not run here
    has no cases and its ``skipif`` says why)."""
    if platform is None:
        return []
    chosen = tuple(dtypes) if dtypes is not None else platform.capabilities.dtypes
    return [(check, dtype) for check in CHECKS for dtype in chosen]


def case_id(value: object) -> str:
    """pytest ids: ``check_ops-bfloat16``."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    return getattr(value, "__name__", str(value))


def run_all(platform: Platform, dtypes: Iterable[torch.dtype] | None = None) -> None:
    """Every check for every advertised dtype (outside pytest; stops at the first failure)."""
    for check, dtype in cases(platform, dtypes):
        check(platform, dtype)


__all__ = ["CHECKS", "GEMM_TOL", "REFERENCE_OPS", "TOL", "Check", "case_id", "cases",
           "check_attention", "check_attention_fp8", "check_attention_int8", "check_linear",
           "check_linear_choice",
           "check_model", "check_model_layernorm", "check_ops", "check_reference_fallback",
           "platform_for", "run_all", "step_metadata", "tiny_model"]
