"""Memory planning: fails before loading with numbers, sizes 'auto', reads checkpoints."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import glowlm
import pytest
import torch
from glowlm.config import EngineConfig
from glowlm.engine import memory
from glowlm.engine.memory import GIB, plan_memory
from glowlm.errors import MemoryPlanError
from glowlm.model_loader.loader import read_model_dir
from glowlm.runtime import topology
from glowlm.testing.tiny_models import make_tiny_model

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("m") / "llama")


def meminfo(gib: float) -> str:
    return f"MemTotal: 99999999 kB\nMemAvailable: {int(gib * (1 << 20))} kB\n"


def cfg(tiny: Path, **kw: object) -> EngineConfig:
    return dataclasses.replace(EngineConfig(model=str(tiny)), **kw)  # type: ignore[arg-type]


def test_too_big_kv_cache_stops_glowlm_llm_before_weights_load(
        tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GLOWLM_CPU_KVCACHE_SPACE=64 cannot fit this 24 GiB machine: no weight is read."""
    import glowlm.engine.setup as setup

    def must_not_load(*a: object, **k: object) -> None:
        raise AssertionError("weights were loaded before the memory plan failed")

    monkeypatch.setattr(setup, "load_model", must_not_load)
    monkeypatch.setenv("GLOWLM_CPU_KVCACHE_SPACE", "64")
    with pytest.raises(MemoryPlanError) as err:
        glowlm.LLM(str(tiny), show_progress=False)
    msg = str(err.value)
    assert "KV cache 64.00 GiB (GLOWLM_CPU_KVCACHE_SPACE=64)" in msg
    assert "GLOWLM_CPU_KVCACHE_SPACE to at most" in msg and "parallel" not in msg
    assert "--dtype bfloat16" in msg and "largest --max-model-len is 1024" in msg


def test_numbers_add_up_and_largest_max_model_len(tiny: Path) -> None:
    info = read_model_dir(tiny)
    t = topology.read(SYSFS / "kvm-epyc-2vcpu")
    ok = plan_memory(info, torch.float32, cfg(tiny), 1024, topo=t, meminfo=meminfo(20))
    per_token = 2 * 2 * 2 * 16 * 4  # K+V, 2 layers, 2 kv heads, head 16, float32
    assert ok.kv_bytes_per_token == per_token and ok.kv_cache_bytes == 4 * GIB
    assert ok.needed_bytes < ok.available_bytes == 20 * GIB
    # Leave room for exactly 300 tokens of KV beyond weights, activations and headroom.
    base = ok.weights_bytes + ok.activation_bytes + ok.headroom_bytes
    tight = (base + 300 * per_token) / GIB
    with pytest.raises(MemoryPlanError, match="largest --max-model-len is 256 tokens "):
        plan_memory(info, torch.float32, cfg(tiny, kv_cache_space_gib=1.0), 1024, topo=t,
                    meminfo=meminfo(tight))


def test_weights_alone_too_big(tiny: Path) -> None:
    info = read_model_dir(tiny)
    t = topology.read(SYSFS / "kvm-epyc-2vcpu")
    with pytest.raises(MemoryPlanError, match="no --max-model-len fits"):
        plan_memory(info, torch.float32, cfg(tiny), 1024, topo=t, meminfo=meminfo(0.3))


def test_auto_takes_a_share_capped_at_what_sequences_can_use(tiny: Path) -> None:
    info = read_model_dir(tiny)
    t = topology.read(SYSFS / "kvm-epyc-2vcpu")
    p = plan_memory(info, torch.float32, cfg(tiny, kv_cache_space_gib=None), 1024, topo=t,
                    meminfo=meminfo(20))
    assert p.kv_auto and p.kv_cache_bytes == 256 * 1024 * p.kv_bytes_per_token
    small = cfg(tiny, kv_cache_space_gib=None, max_num_seqs=4096)
    q = plan_memory(info, torch.float32, small, 1024, topo=t, meminfo=meminfo(2))
    act0 = memory.activation_bytes(memory.model_dims(info.hf_config), torch.float32, small,
                                   1024, 0)
    spare = q.available_bytes - q.weights_bytes - act0 - q.headroom_bytes
    assert q.kv_cache_bytes == int(memory.AUTO_KV_SHARE * spare)
    assert q.needed_bytes <= q.available_bytes
    assert "auto" in q.describe()


def test_cgroup_limit_is_the_tightest(tiny: Path) -> None:
    info = read_model_dir(tiny)
    t = topology.read(SYSFS / "container-cpuset")  # 32 GiB limit, 1 GiB in use
    p = plan_memory(info, torch.float32, cfg(tiny), 1024, topo=t, node=0, meminfo=meminfo(500))
    assert p.available_bytes == 31 * GIB and "cgroup memory limit" in p.available_source


def test_numa_node_is_the_limit_for_a_bound_rank(tiny: Path) -> None:
    info = read_model_dir(tiny)
    t = topology.read(SYSFS / "two-socket-snc2")
    p = plan_memory(info, torch.float32, cfg(tiny), 1024, topo=t, node=2, meminfo=meminfo(500))
    assert p.available_source == "NUMA node 2 free memory"
    assert p.available_bytes == t.nodes[2].available_bytes


def test_weights_follow_the_target_dtype(tiny: Path) -> None:
    info = read_model_dir(tiny)
    f32, largest, how = memory.weight_bytes(info, torch.float32)
    bf16, _, _ = memory.weight_bytes(info, torch.bfloat16)
    assert how == "safetensors headers" and bf16 * 2 == f32 and 0 < largest < f32
    file_bytes = sum(f.stat().st_size for f in tiny.glob("*.safetensors"))
    assert f32 <= file_bytes < f32 + 64 * 1024  # the file is the tensors plus a header
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny)
    assert f32 == sum(p.numel() * 4 for p in hf.state_dict().values()) - (
        0 if not hf.config.tie_word_embeddings else hf.lm_head.weight.numel() * 4)


def test_parameter_count_fallback_without_files(tiny: Path, tmp_path: Path) -> None:
    info = dataclasses.replace(read_model_dir(tiny), path=tmp_path)
    estimate, _, how = memory.weight_bytes(info, torch.float32)
    actual, _, _ = memory.weight_bytes(read_model_dir(tiny), torch.float32)
    assert how.startswith("parameter count") and 0.8 < estimate / actual < 1.25


@pytest.mark.parametrize("arch", ["gpt2", "opt", "qwen3"])
def test_dims_for_other_namings(arch: str) -> None:
    from glowlm.testing.tiny_models import hf_config

    d = memory.model_dims(hf_config(arch))
    assert (d.layers, d.hidden, d.heads) == (2, 64, 4)
    assert d.head_dim == (32 if arch == "qwen3" else 16) and d.vocab > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "opt", "gpt2"])
def test_plan_and_engine_agree_on_kv_bytes(arch: str, tmp_path: Path) -> None:
    """The plan sizes the cache from config.json, the engine from the built model."""
    from glowlm.attention.backend import kv_bytes_per_token
    from glowlm.engine.setup import build_engine_parts

    gqa = {"num_key_value_heads": 2} if arch in ("llama", "qwen2") else {}
    path = make_tiny_model(arch, tmp_path / arch, **gqa)
    setup = build_engine_parts(EngineConfig(model=str(path), dtype="float32"),
                               show_progress=False)
    model = setup.model
    engine = kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_size,
                                torch.float32)
    planned = memory.kv_bytes_per_token(memory.model_dims(setup.info.hf_config), torch.float32)
    assert planned == engine > 0


def test_native_gguf_experts_count_at_their_block_width(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A MoE GGUF's experts are most of its bytes: the plan counts natively run layers
    at their bits (plus a float32 scale and zero per group), not dequantized, so a file
    that fits once loaded is not refused; with GLOWLM_GGUF_NATIVE=0 it is the dense
    size."""
    from glowlm.testing.tiny_gguf import write_tiny_gguf

    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "cache"))
    model = make_tiny_model("qwen3_moe", tmp_path / "moe")
    path = write_tiny_gguf(model, tmp_path / "moe.gguf", "Q4_0")
    native_info = read_model_dir(path)
    assert any(".experts." in m for m in native_info.gguf_native)
    native, _, how = memory.weight_bytes(native_info, torch.float32)
    assert "native blocks" in how
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "0")
    dense_info = read_model_dir(path)
    dense, _, how = memory.weight_bytes(dense_info, torch.float32)
    assert how == "GGUF header, dequantized" and not dense_info.gguf_native
    # 4 bits + 2 float32 per 32 weights = 0.75 bytes against 4 (float32), on most bytes.
    assert native < 0.35 * dense
    t = topology.read(SYSFS / "kvm-epyc-2vcpu")
    plan = plan_memory(native_info, torch.float32, cfg(path), 1024, topo=t, meminfo=meminfo(20))
    assert plan.weights_bytes == native
