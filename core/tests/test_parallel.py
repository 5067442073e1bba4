"""Tensor and pipeline parallelism: real rank processes give TP = 1's greedy tokens.

Every engine here is a real group: rank 0 in the test process, the others spawned,
shared-memory collectives between them. The workload exercises chunked prefill
(a 48-token budget against ~70-token prompts), preemption (too few KV blocks for
all sequences at once) and prefix-cache hits (prompts sharing a 64-token prefix).
Ranks are oversubscribed on small machines (GLOWLM_CPU_OMP_THREADS_BIND=nobind,
one OpenMP thread per rank).
"""

from __future__ import annotations

import os

import pytest
from glowlm import LLM, SamplingParams
from glowlm.errors import ConfigError
from glowlm.testing.parallel import (
    ENGINE,
    child_pids,
    greedy_tokens,
    pid_alive,
    rank_env,
    reference_tokens,
    workload_prompts,
)


@pytest.fixture(autouse=True)
def _one_thread_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in rank_env().items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tp2_matches_tp1(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    """llama: GQA (4 heads, 2 KV heads), untied head; gpt2: fused c_attn, biases, tied."""
    assert greedy_tokens(str(tiny_model_dir(arch)), tensor_parallel_size=2) == \
        reference_tokens(tiny_model_dir(arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "opt", "mistral"])
def test_tp2_matches_tp1_more_architectures(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    assert greedy_tokens(str(tiny_model_dir(arch)), tensor_parallel_size=2) == \
        reference_tokens(tiny_model_dir(arch))


@pytest.mark.parametrize("arch", ["gpt2"])
def test_pp2_matches_tp1(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    """Two pipeline stages, one layer each: hidden states go rank to rank every step."""
    assert greedy_tokens(str(tiny_model_dir(arch)), pipeline_parallel_size=2) == \
        reference_tokens(tiny_model_dir(arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "opt", "qwen2"])
def test_pp2_matches_tp1_more_architectures(tiny_model_dir, arch: str) -> None:  # noqa: ANN001
    assert greedy_tokens(str(tiny_model_dir(arch)), pipeline_parallel_size=2) == \
        reference_tokens(tiny_model_dir(arch))


def test_tp2_pp2_matches_tp1(tiny_model_dir) -> None:  # noqa: ANN001
    """Four ranks on this machine's CPUs (oversubscribed): two stages of two TP ranks."""
    assert greedy_tokens(str(tiny_model_dir("llama")), tensor_parallel_size=2,
                         pipeline_parallel_size=2) == reference_tokens(tiny_model_dir("llama"))


def test_tp2_on_the_native_platform(tiny_model_dir, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The platform's compiled kernels per rank (x86: the decoder stack with compiled
    all-reduces under TP, plugins/x86/tests/test_kernels_tp.py): same greedy tokens."""
    monkeypatch.delenv("GLOWLM_PLATFORM")
    model = str(tiny_model_dir("llama"))
    assert greedy_tokens(model, tensor_parallel_size=2) == greedy_tokens(model)


@pytest.mark.slow
def test_tp4_replicates_kv_heads(tiny_model_dir) -> None:  # noqa: ANN001
    """TP 4 > 2 KV heads: each KV head lives on two ranks."""
    assert greedy_tokens(str(tiny_model_dir("llama")), tensor_parallel_size=4) == \
        reference_tokens(tiny_model_dir("llama"))


def test_tp_that_does_not_divide_heads_is_refused(tiny_model_dir) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="does not divide the model.s 4 attention heads"):
        LLM(str(tiny_model_dir("llama")), tensor_parallel_size=3, **ENGINE)


def test_bad_sizes_are_config_errors(tiny_model_dir) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="--tensor-parallel-size must be an integer >= 1"):
        LLM(str(tiny_model_dir("llama")), tensor_parallel_size=0, **ENGINE)


# --- failure behaviour ----------------------------------------------------------------

def test_a_killed_rank_ends_the_group_with_one_line(tiny_model_dir) -> None:  # noqa: ANN001
    import signal

    from glowlm.distributed.shm import RankFailure

    llm = LLM(str(tiny_model_dir("llama")), tensor_parallel_size=2, **ENGINE)
    try:
        proc = llm.engine.executor.procs[0]
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(RankFailure, match=rf"rank 1 \(pid {proc.pid}\) was killed by "
                                              r"SIGKILL; stopped all 2 ranks"):
            llm.generate([{"prompt_token_ids": p} for p in workload_prompts()],
                         SamplingParams(max_tokens=150, ignore_eos=True), use_tqdm=False)
        assert not any(p.is_alive() for p in llm.engine.executor.procs)
    finally:
        llm.engine.shutdown()


def test_a_plan_that_does_not_fit_names_the_rank(tiny_model_dir) -> None:  # noqa: ANN001
    from glowlm.errors import MemoryPlanError

    with pytest.raises(Exception, match=r"does not fit in memory: rank \d of 2") as info:
        LLM(str(tiny_model_dir("llama")), tensor_parallel_size=2,
            **{**ENGINE, "kv_cache_space_gib": 100000.0})
    assert isinstance(info.value, MemoryPlanError) or "rank 1:" in str(info.value)


def test_sigterm_stops_every_rank(tiny_model_dir, tmp_path) -> None:  # noqa: ANN001
    """The CLI driver killed by SIGTERM: its rank processes go too (no orphans)."""
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "GLOWLM_CPU_KVCACHE_SPACE": "0.02"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "glowlm.entrypoints.cli.main", "generate",
         str(tiny_model_dir("llama")), "--prompt", "def fib", "--max-tokens", "100000",
         "--ignore-eos", "-tp", "2", "--block-size", "32"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            children = child_pids(proc.pid)
            line = proc.stderr.readline() if proc.stderr else ""
            if children and "KV cache" in line and "rank" not in line:
                break  # the driver finished start-up: generating
        assert children, "no rank process started"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(pid_alive(c) for c in children):
            time.sleep(0.1)
        assert not any(pid_alive(c) for c in children)
        import glob

        assert not glob.glob(f"/dev/shm/glowlm-{proc.pid}-*")  # segments unlinked early
    finally:
        if proc.poll() is None:
            proc.kill()




def test_the_tp_start_up_line_says_which_stacks_run_sharded(caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    """Only a stack that does the all-reduces itself (``accepts_tensor_parallel``) is
    announced as running under TP; the others as module by module."""
    import logging

    from glowlm.engine.setup import _log_fused_under_tp
    from glowlm.ops.table import OpsTable

    def stack(*args: object) -> None:
        return None

    def sharded(*args: object) -> None:
        return None

    sharded.accepts_tensor_parallel = True  # type: ignore[attr-defined]
    logger = logging.getLogger("glowlm")
    logger.addHandler(caplog.handler)
    try:
        _log_fused_under_tp(OpsTable(rms_decoder_stack=sharded, ln_decoder_stack=stack))
        _log_fused_under_tp(OpsTable(ln_decoder_stack=stack))
        _log_fused_under_tp(OpsTable())
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "rms_decoder_stack: every layer in one call" in lines[0]
    assert "layers for ln_decoder_stack: module by module" in lines[0]
    assert lines[1].startswith("fused decoder layer/stack ops off under tensor parallelism")


def test_bench_tp_alternates_runs_between_two_loaded_engines(tiny_model_dir) -> None:  # noqa: ANN001
    """The TP benchmark's protocol end to end: both engines load, runs alternate ABBA,
    every pair and the ratio are printed (speed itself is never asserted)."""
    import subprocess
    import sys

    from glowlm.bench.tp import pair_order

    assert [pair_order((1, 2), r) for r in range(3)] == [(1, 2), (2, 1), (1, 2)]
    env = {**os.environ, "GLOWLM_CPU_KVCACHE_SPACE": "0.02"}
    proc = subprocess.run(
        [sys.executable, "-m", "glowlm.bench.tp", str(tiny_model_dir("llama")),
         "--rounds", "2", "--input-len", "8", "--output-len", "4", "--dtype", "float32"],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "ratio" in out and "2 alternated runs each" in out, out
    assert "  pair 1: TP = 1 " in out and "  pair 2: TP = 1 " in out, out
    assert "median of the per-pair ratios" in out and "GB/s before" in out, out
    assert "round 2 of 2 done" in proc.stderr
