"""``--kv-cache-dtype``: 8-bit float caches (fp8 = E4M3, fp8_e5m2), int8 with a scale
per row, and the float ones.

* Names: vLLM's, validated in the config (one line naming the choices), on the CLI.
* Memory: the plan and the engine count tokens at the stored width: twice bf16's tokens
  in the same space for 8-bit, and the start-up line says how many and in what dtype.
* Values: the reference backend over an fp8 cache equals the reference over a float32
  cache holding the same rows rounded to fp8 (the cast is the only change; the
  attention math is the same), and rows beyond E4M3's range saturate at ±448 instead of
  becoming NaN (E5M2: at ±57344, not inf).
* int8: a row is ``round(x / s)`` with ``s = amax / 127`` in fp16 appended, so every
  value is within half a step of the row's scale; the reference over an int8 cache equals
  the reference over a float32 cache holding the dequantized rows.
* Engine: greedy decoding with an 8-bit cache runs through chunked prefill, decodes and
  prefix-cache hits (a repeated prompt gives its first run's tokens), on the reference
  platform and on the host's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.attention.backend import (
    AttentionLayerSpec,
    dequantize_int8_rows,
    kv_row_size,
    quantize_int8_rows,
    resolve_kv_cache_dtype,
    to_cache,
)
from glowlm.attention.reference import ReferenceAttentionBackend
from glowlm.config import EngineConfig
from glowlm.engine.memory import plan_memory
from glowlm.errors import ConfigError
from glowlm.model_loader.loader import read_model_dir
from glowlm.runtime import topology
from glowlm.testing.contract import step_metadata
from glowlm.testing.tiny_models import SMALL_ENGINE, make_tiny_model

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"
FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
       "fp8_e5m2": torch.float8_e5m2}
EIGHT_BIT = {**FP8, "int8": torch.int8}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("kv") / "llama")


def test_names_resolve_and_a_bad_one_is_one_line() -> None:
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) is torch.bfloat16
    for name, dtype in EIGHT_BIT.items():
        assert resolve_kv_cache_dtype(name, torch.bfloat16) is dtype
    with pytest.raises(ConfigError, match=r"--kv-cache-dtype 'int4' is not one of auto, "):
        EngineConfig.create("m", kv_cache_dtype="int4")


def test_cli_flag_reaches_the_engine_config() -> None:
    import argparse

    from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert engine_kwargs(p.parse_args(["--kv-cache-dtype", "fp8_e5m2"]))["kv_cache_dtype"] \
        == "fp8_e5m2"
    with pytest.raises(SystemExit):
        p.parse_args(["--kv-cache-dtype", "q8_0"])


def test_eight_bit_caches_hold_twice_the_tokens(tiny: Path) -> None:
    info = read_model_dir(tiny)
    t = topology.read(SYSFS / "kvm-epyc-2vcpu")
    meminfo = f"MemTotal: 99999999 kB\nMemAvailable: {20 << 20} kB\n"

    def plan(kv: str):  # noqa: ANN202
        cfg = dataclasses.replace(EngineConfig(model=str(tiny)), kv_cache_dtype=kv)
        return plan_memory(info, torch.bfloat16, cfg, 1024, topo=t, meminfo=meminfo)

    bf16, fp8 = plan("auto"), plan("fp8")
    assert bf16.kv_cache_bytes == fp8.kv_cache_bytes
    assert bf16.kv_bytes_per_token == 2 * fp8.kv_bytes_per_token
    tokens = fp8.kv_cache_bytes // fp8.kv_bytes_per_token
    assert f"{tokens} tokens, float8_e4m3fn" in fp8.describe()
    assert f"{tokens // 2} tokens, bfloat16" in bf16.describe()
    # int8: each row keeps its 2-byte scale beside head_size values.
    c = info.hf_config
    int8, hs = plan("int8"), getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert int8.kv_bytes_per_token * hs == fp8.kv_bytes_per_token * kv_row_size(hs, torch.int8)
    assert "int8" in int8.describe()


def test_int8_rows_round_trip_within_half_a_step() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 64, generator=g) * torch.tensor([0.01, 1.0, 300.0])[:, None]
    x[0, 0] = 0.0  # an all-zero row: scale 0, values 0
    rows = quantize_int8_rows(x.to(torch.bfloat16))
    assert rows.dtype is torch.int8 and rows.shape == (5, 3, 66)
    scale = rows[..., 64:].contiguous().view(torch.float16).float()
    assert scale[0, 0].item() == 0.0 and rows[0, 0].eq(0).all()
    back = dequantize_int8_rows(rows)
    xb = x.to(torch.bfloat16).float()
    assert ((back - xb).abs() <= scale * 0.5 + 1e-12).all()
    assert rows[..., :64].abs().amax(-1)[1:].ge(126).all()  # the row's largest value: ±127


def test_to_cache_saturates() -> None:
    x = torch.tensor([1e4, -1e9, 3.0, float("inf")])
    assert to_cache(x, torch.float8_e4m3fn).float().tolist() == [448.0, -448.0, 3.0, 448.0]
    assert to_cache(x, torch.float8_e5m2).float().tolist()[:3] == [10240.0, -57344.0, 3.0]
    assert to_cache(x, torch.float8_e5m2).float().isfinite().all()


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["e4m3", "e5m2"])
def test_reference_reads_the_rounded_rows(kv_dtype: torch.dtype) -> None:
    """Attention over an fp8 cache is attention over the rows rounded to fp8."""
    ref = ReferenceAttentionBackend()
    heads, kv_heads, hs, block = 4, 2, 32, 32
    spec = AttentionLayerSpec(heads, kv_heads, hs, hs ** -0.5)
    g = torch.Generator().manual_seed(0)
    steps = [(37, 37), (1, 1)]
    tables = [[3, 1], [0]]
    tokens = sum(q for q, _ in steps)
    q = torch.randn(tokens, heads, hs, generator=g)
    k = torch.randn(tokens, kv_heads, hs, generator=g) * 3
    v = torch.randn(tokens, kv_heads, hs, generator=g)
    fp8_cache = torch.zeros(2, 4, kv_heads, block, hs, dtype=kv_dtype)
    f32_cache = torch.zeros(2, 4, kv_heads, block, hs)
    got = ref.forward(spec, q, k, v, fp8_cache, ref.build_metadata(step_metadata(steps, tables,
                                                                                block)))
    kr, vr = (to_cache(t, kv_dtype).float() for t in (k, v))
    want = ref.forward(spec, q, kr, vr, f32_cache, ref.build_metadata(step_metadata(
        steps, tables, block)))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fp8_cache.float(), f32_cache, rtol=0, atol=0)


def test_reference_reads_the_dequantized_int8_rows() -> None:
    """Attention over an int8 cache is attention over its rows dequantized."""
    ref = ReferenceAttentionBackend()
    heads, kv_heads, hs, block = 4, 2, 32, 32
    spec = AttentionLayerSpec(heads, kv_heads, hs, hs ** -0.5)
    g = torch.Generator().manual_seed(0)
    steps, tables = [(37, 37), (1, 1)], [[3, 1], [0]]
    tokens = sum(q for q, _ in steps)
    q, k, v = (torch.randn(tokens, h, hs, generator=g) for h in (heads, kv_heads, kv_heads))
    int8_cache = torch.zeros(2, 4, kv_heads, block, kv_row_size(hs, torch.int8),
                             dtype=torch.int8)
    f32_cache = torch.zeros(2, 4, kv_heads, block, hs)
    got = ref.forward(spec, q, k, v, int8_cache, ref.build_metadata(step_metadata(
        steps, tables, block)))
    kr, vr = (dequantize_int8_rows(quantize_int8_rows(t)) for t in (k, v))
    want = ref.forward(spec, q, kr, vr, f32_cache, ref.build_metadata(step_metadata(
        steps, tables, block)))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dequantize_int8_rows(int8_cache), f32_cache, rtol=0, atol=0)


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("platform", ["generic", None], ids=["reference", "host"])
@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2", "int8"])
def test_engine_runs_on_an_eight_bit_cache(tiny: Path, kv: str, platform: str | None) -> None:
    prompts = [list(range(5, 5 + n)) for n in (3, 45, 90)]
    llm = LLM(str(tiny), platform=platform, kv_cache_dtype=kv, dtype="float32",
              max_num_batched_tokens=64, **SMALL_ENGINE)
    assert all(c.dtype is EIGHT_BIT[kv] for c in llm.engine.runner.kv_caches)
    first = _greedy(llm, prompts)
    assert _greedy(llm, prompts) == first  # prefix-cache hits read the same 8-bit blocks
    assert all(len(t) == 10 for t in first)
