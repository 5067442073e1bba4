"""The workload of the parallelism tests: a group's greedy tokens against TP = 1's.

One workload for every TP / PP / multi-host test, so that they all exercise the same
engine paths: chunked prefill (a 48-token budget against ~70-token prompts),
preemption (8 KV blocks of 32 tokens, too few for all sequences at once) and
prefix-cache hits (four prompts share a 64-token prefix), on the tiny checkpoints of
:mod:`glowlm.testing.tiny_models` (token ids below their vocabulary of 384).
Ranks outnumber the cores on small machines: :func:`rank_env` gives each one unbound
OpenMP thread.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

# Re-exported: plugin tests of compiled collectives that must agree with the shared-
# memory group op by op reach core through the test kit only.
from glowlm.distributed.shm import RankFailure, ShmGroup, create_segment, unlink_segment

__all__ = ["ENGINE", "RankFailure", "ShmGroup", "child_pids", "create_segment", "greedy_tokens",
           "pid_alive", "rank_env", "reference_tokens", "unlink_segment", "workload_prompts"]

#: Engine arguments of the workload (small blocks and budget: preemption and chunking).
ENGINE = dict(block_size=32, max_num_batched_tokens=48, max_num_seqs=4, num_kv_blocks=8,
              kv_cache_space_gib=0.02, show_progress=False)


def rank_env(platform: str | None = None) -> dict[str, str]:
    """Environment of a test's ranks: ``platform`` (default: ``GLOWLM_TEST_PLATFORM``,
    else the generic reference ops), one OpenMP thread per rank, no CPU binding."""
    return {"GLOWLM_PLATFORM": platform or os.environ.get("GLOWLM_TEST_PLATFORM", "generic"),
            "GLOWLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def workload_prompts() -> list[list[int]]:
    """Seven seeded prompts: four sharing a 64-token prefix, three of 60-90 tokens."""
    rng = random.Random(1)
    shared = [rng.randrange(3, 384) for _ in range(64)]
    prompts = [shared + [rng.randrange(3, 384) for _ in range(rng.randrange(3, 12))]
               for _ in range(4)]
    return prompts + [[rng.randrange(3, 384) for _ in range(rng.randrange(60, 90))]
                      for _ in range(3)]


def greedy_tokens(model: str | Path, **kwargs: object) -> list[list[int]]:
    """40 greedy tokens per workload prompt from an ``LLM`` built with ``kwargs`` (the
    group's sizes); checks that the workload preempted, and shuts the engine down."""
    from glowlm import LLM, SamplingParams

    llm = LLM(str(model), **ENGINE, **kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in workload_prompts()],
                            SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
                            use_tqdm=False)
        assert llm.engine.scheduler.num_preemptions > 0, "the workload should preempt"
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.engine.shutdown()


_REFERENCE: dict[tuple[str, str], list[list[int]]] = {}


def reference_tokens(model: str | Path) -> list[list[int]]:
    """TP = 1's :func:`greedy_tokens` for ``model`` on the platform ``GLOWLM_PLATFORM``
    names now (call it after the test set its environment); computed once per process,
    model and platform."""
    key = (str(model), os.environ.get("GLOWLM_PLATFORM", ""))
    if key not in _REFERENCE:
        _REFERENCE[key] = greedy_tokens(model)
    return _REFERENCE[key]


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid`` (Linux /proc): a group's rank processes."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, already ended, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
