"""Tensor-parallel decode in compiled code: the shared-memory all-reduce and the stack.

The compiled all-reduce (``shm_all_reduce``, and inside ``rms_decoder_stack_q``) runs
the protocol of :mod:`glowlm.distributed.shm` on the same segment and op counter as
the Python group, so ranks may mix the two op by op: checked here with two real
processes alternating them (directly, and as the group's own all-reduce once the
platform's ``OpsTable.shm_all_reduce`` is plugged in, as an engine's TP rank does),
chunked (tensors larger than a slot), in the three dtypes, against the sum the Python
path defines (fp32 accumulation, one rounding).
Then the engine: at TP = 2 the x86 stacks (Llama's, Gemma 3's, OPT/GPT-2's) run every layer
with its all-reduces in one call, and the tokens and log-probabilities equal the
module path's at TP = 2 bit for bit (same kernels, same reduction order).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.testing.parallel import (
    RankFailure,
    ShmGroup,
    create_segment,
    rank_env,
    unlink_segment,
)
from glowlm.testing.tiny_models import make_tiny_model
from glowlm_x86.kernels import ops
from glowlm_x86.kernels.testing import require_kernels

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_RANK = r"""
import sys, torch
from glowlm.testing.parallel import ShmGroup
from glowlm.plugin_api import core_env, live_host
from glowlm_x86.kernels import cpu_isa, load, ops
path, rank, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
assert load(cpu_isa(live_host()), core_env().kernel_cache) is not None
group = ShmGroup(path, 2, rank, slot_bytes=4096, spin_seconds=0.0)
results = []
for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.float16] * 3):
    x = ((torch.arange(3000, dtype=torch.float32) * 0.37 + i) * (rank + 1)).sin().to(dtype)
    way = (i + rank) % 3
    if way == 0:
        torch.ops.glowlm_x86.shm_all_reduce(x, group.native_state())
    elif way == 1:
        group.all_reduce(x)  # the Python path
    else:
        group.use_compiled_all_reduce(ops.shm_all_reduce)
        assert group.all_reduce(x) is x
        group.use_compiled_all_reduce(None)
    results.append(x)
torch.save(results, out)
"""


def _part(i: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    return ((torch.arange(3000, dtype=torch.float32) * 0.37 + i) * (rank + 1)).sin().to(dtype)


def test_compiled_all_reduce_interleaves_with_the_python_group(tmp_path: Path) -> None:
    require_kernels()
    path = create_segment(2, "test", slot_bytes=4096)
    try:
        procs = [subprocess.Popen([sys.executable, "-c", _RANK, path, str(r),
                                   str(tmp_path / f"{r}.pt")], stderr=subprocess.PIPE,
                                  text=True) for r in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err[-2000:]
    finally:
        unlink_segment(path)
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    for i, dtype in enumerate(DTYPES * 3):
        want = (_part(i, 0, dtype).float() + _part(i, 1, dtype).float()).to(dtype)
        assert torch.equal(got[0][i], want) and torch.equal(got[1][i], want), (i, dtype)


def test_compiled_all_reduce_raises_once_the_group_is_stopped() -> None:
    require_kernels()
    path = create_segment(2, "test", slot_bytes=4096)
    try:
        group = ShmGroup(path, 2, 0, slot_bytes=4096, spin_seconds=0.0)
        group.abort()  # as the driver does when a rank dies: rank 1 never answers
        with pytest.raises(RuntimeError, match="stopped"):
            torch.ops.glowlm_x86.shm_all_reduce(torch.ones(8), group.native_state())
        group.dead_reason = "rank 1 died"
        group.use_compiled_all_reduce(ops.shm_all_reduce)
        with pytest.raises(RankFailure, match="rank 1 died"):  # what the engine handles
            group.all_reduce(torch.ones(8))
    finally:
        unlink_segment(path)


def _run_tp2(model: Path, dtype: str) -> tuple[list[list[int]], list[list[float]], int]:
    llm = LLM(str(model), dtype=dtype, tensor_parallel_size=2, kv_cache_space_gib=0.05,
              block_size=32, max_model_len=128, show_progress=False)
    try:
        model = llm.engine.runner.model  # rank 0 runs in this process
        stack = getattr(model, "model", model).stack  # Llama/Gemma: model.model; OPT/GPT-2
        calls = [0]
        if stack.fn is not None:
            fn = stack.fn

            def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                out = fn(*args, **kwargs)
                calls[0] += out is not None
                return out

            stack.fn = counted
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n in (6, 45, 70)]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                           logprobs=0), use_tqdm=False)
    finally:
        llm.engine.shutdown()
    return ([o.outputs[0].token_ids for o in outs],
            [[next(iter(d.values())).logprob for d in o.outputs[0].logprobs] for o in outs],
            calls[0])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "opt", "gpt2"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tp2_stack_equals_tp2_modules(arch: str, dtype: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """GQA llama (4 heads, 2 KV heads): each rank holds 2 heads and 1 KV head. Gemma 3
    (gemma_decoder_stack): local and global layers, prompts past its 12-token window.
    OPT and GPT-2 (ln_decoder_stack): biases on every projection, added once after the
    sums of the row-parallel out and fc2."""
    require_kernels()
    for k, v in rank_env("x86").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "glowlm")  # the module path on the same kernels
    model = make_tiny_model(arch, tmp_path / arch)
    tokens, logprobs, calls = _run_tp2(model, dtype)
    assert calls > 0, "the tensor-parallel stack should run"
    monkeypatch.setenv("GLOWLM_NO_FUSED_LAYERS", "1")
    tokens_ref, logprobs_ref, calls_ref = _run_tp2(model, dtype)
    assert calls_ref == 0
    assert tokens == tokens_ref
    assert logprobs == logprobs_ref


@pytest.mark.skipif("avx2" not in Path("/proc/cpuinfo").read_text(),
                    reason="the bench is built for the avx2 variant")
def test_bench_tp_gemv_program_builds_and_reports_both_layouts() -> None:
    """``bench_linear.py --native avx2 --program tp`` (docs/parallelism.md) compiles
    csrc/test/bench_tp.cpp and prints TP = 1, TP = 2 and their ratio; a tiny shape here,
    so the figures mean nothing, only that the command a user runs works."""
    tool = Path(__file__).resolve().parents[3] / "tools" / "x86" / "bench_linear.py"
    out = subprocess.run(
        [sys.executable, str(tool), "--native", "avx2", "--program", "tp", "--threads", "2",
         "--", "--reps", "1", "--layers", "1", "--hidden", "256", "--inter", "512", "--kv",
         "64", "--vocab", "1024"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tp1 (2 threads share each matrix)" in out.stdout
    assert "tp2 (1 thread per rank, own shards)" in out.stdout
    assert "tp2 / tp1 speed:" in out.stdout
