"""Make the tiny quantized test checkpoints with the real quantization tool (llm-compressor).

The test fixtures in ``core/tests/fixtures/quant/`` were made by this script; tests read
them and never need llm-compressor (it pins its own transformers, so it lives in its own
virtual environment, not in glowlm's)::

    python3 -m venv /work/venvs/llmcompressor
    /work/venvs/llmcompressor/bin/pip install torch==2.13.0      # first: keep the CPU build
    /work/venvs/llmcompressor/bin/pip install llmcompressor
    /work/venvs/llmcompressor/bin/python tools/make_quant_checkpoints.py core/tests/fixtures/quant

Each checkpoint starts from a seeded random tiny model (the shapes of
``glowlm.testing.tiny_models``, sized so every input width is a multiple of the group
size), is calibrated by a real llm-compressor recipe (GPTQ, AWQ, round-to-nearest) on
seeded random token sequences and saved compressed (compressed-tensors format). Beside it,
``reference.json`` holds what transformers (with the compressed-tensors package, which
decompresses the checkpoint itself) computes from that checkpoint in float32: the prompt
log-probabilities and greedy tokens the tests compare glowlm against. The same tool
therefore writes the format and gives the reference, independently of glowlm's parser.

``--gptqmodel`` (run with a venv holding GPTQModel and torch 2.13, e.g.
``pip install -c <(echo torch==2.13.0) gptqmodel`` -> 7.6.0) writes the classic GPTQ
layout fixtures instead. ``--bench .bench_models/llama-1b-rand`` writes quantized
copies of a benchmark checkpoint beside it (:data:`BENCH_SCHEMES`; by default W4A16 group
128 symmetric and with zero points, and W8A8 dynamic, round-to-nearest), once each, for
``make bench-peers-quant`` (``tools/bench_quant_peers.py``, docs/quantization.md);
``make bench-models-quant`` runs it in the venv ``make quant-venv`` builds
(``.venv-llmcompressor``, the recipe above).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[0, 17, 42, 99, 7, 250, 3, 64, 120, 5, 77, 300], [0, 11, 12, 13, 200, 201, 9]]
GREEDY_TOKENS = 8


def _weights(bits: int, strategy: str, group: int | None = None, sym: bool = True,
             actorder: str | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"num_bits": bits, "type": "int", "symmetric": sym,
                            "strategy": strategy}
    if group is not None:
        args["group_size"] = group
    if actorder is not None:
        args["actorder"] = actorder
    return args


def _int8_input(strategy: str, dynamic: bool, sym: bool = True) -> dict[str, Any]:
    return {"num_bits": 8, "type": "int", "symmetric": sym, "strategy": strategy,
            "dynamic": dynamic}


#: name -> (base model, modifier, quantization groups). Tiny on purpose (tens of KB each).
RECIPES: dict[str, tuple[str, str, dict[str, Any]]] = {
    # GPTQ W4A16, group 32, symmetric (pack-quantized).
    "gptq-w4a16-g32-sym": ("llama", "gptq", {"weights": _weights(4, "group", 32)}),
    # GPTQ W4A16, group 32, asymmetric, activation order "weight" (llm-compressor 0.14 removed
    # "group", the only order that saved weight_g_idx; g_idx comes from the GPTQ layout).
    "gptq-w4a16-g32-asym-actorder": ("qwen2", "gptq", {
        "weights": _weights(4, "group", 32, sym=False, actorder="weight")}),
    # GPTQ W4A16, group 128 (the preset's group size), symmetric.
    "gptq-w4a16-g128": ("llama128", "gptq", {"weights": _weights(4, "group", 128)}),
    # AWQ W4A16 asymmetric (zero points), group 32.
    "awq-w4a16-g32-asym": ("llama", "awq", {"weights": _weights(4, "group", 32, sym=False)}),
    # W8A16: int8 weights per output channel (pack-quantized, 4 per int32).
    "w8a16-channel": ("llama", "rtn", {"weights": _weights(8, "channel")}),
    # W4A16 per output channel (group -1).
    "w4a16-channel": ("qwen2", "rtn", {"weights": _weights(4, "channel")}),
    # W8A8 int8: weights per channel, activations dynamic per token (the INT8_W8A8 preset).
    "w8a8-dynamic": ("llama", "gptq", {"weights": _weights(8, "channel"),
                                       "input_activations": _int8_input("token", True)}),
    # W8A8 int8: weights per tensor, activations static per tensor (calibrated scale).
    "w8a8-static-tensor": ("qwen2", "rtn", {"weights": _weights(8, "tensor"),
                                           "input_activations": _int8_input("tensor", False)}),
}


def _base_model(kind: str, out: Path) -> None:
    """A seeded random bf16 tiny model (glowlm's tiny shapes; llama128 for group 128)."""
    sys.path.insert(0, str(ROOT / "core"))
    import torch
    from glowlm.testing import tiny_models
    from transformers import AutoModelForCausalLM

    if kind == "llama128":
        cfg = tiny_models.hf_config("llama", hidden_size=128, intermediate_size=256,
                                    num_hidden_layers=1, head_dim=32)
    elif kind == "llama":
        cfg = tiny_models.hf_config("llama", num_hidden_layers=1)
    else:
        cfg = tiny_models.hf_config(kind)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():  # larger weights than the init: logits that differ
            p.normal_(0.0, 0.08) if p.ndim > 1 else None
    model.to(torch.bfloat16).save_pretrained(out)
    tiny_models._tokenizer(out)


def _calibration(n: int = 16, length: int = 48) -> Any:
    import torch
    from datasets import Dataset

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 384, (n, length), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(),
                              "attention_mask": torch.ones_like(ids).tolist()})


def _modifier(kind: str, scheme: dict[str, Any]) -> Any:
    groups = {"group_0": {"targets": ["Linear"], **scheme}}
    if kind == "gptq":
        from llmcompressor.modifiers.gptq import GPTQModifier

        return GPTQModifier(config_groups=groups, ignore=["lm_head"], block_size=32)
    if kind == "awq":
        from llmcompressor.modifiers.awq import AWQModifier
        from llmcompressor.pipelines.cache import IntermediatesCache

        # llm-compressor 0.14 pins AWQ's cached activations for host-to-device copies,
        # which raises on a machine without an accelerator; on CPU there is no copy.
        IntermediatesCache._pin_intermediate = classmethod(lambda cls, value: None)

        return AWQModifier(config_groups=groups, ignore=["lm_head"])
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return QuantizationModifier(config_groups=groups, ignore=["lm_head"])


def _reference(path: Path) -> dict[str, Any]:
    """Transformers on the compressed checkpoint, float32: prompt log-probs, greedy tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    out: dict[str, Any] = {"prompts": PROMPTS, "prompt_logprobs": [], "greedy": []}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            out["prompt_logprobs"].append(
                [float(logp[i, prompt[i + 1]]) for i in range(len(prompt) - 1)])
            gen = model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False,
                                 min_new_tokens=GREEDY_TOKENS)
            out["greedy"].append(gen[0, len(prompt):].tolist())
    return out


def make(name: str, out_dir: Path, work: Path) -> None:
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kind, modifier, scheme = RECIPES[name]
    base = work / f"base-{kind}"
    if not base.exists():
        _base_model(kind, base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(base)
    oneshot(model=model, dataset=_calibration(), recipe=_modifier(modifier, scheme),
            max_seq_length=48, num_calibration_samples=16)
    target = out_dir / name
    shutil.rmtree(target, ignore_errors=True)
    model.save_pretrained(target, save_compressed=True)
    tok.save_pretrained(target)
    for junk in ("recipe.yaml",):
        (target / junk).unlink(missing_ok=True)
    (target / "reference.json").write_text(json.dumps(_reference(target)) + "\n")
    print(f"{name}: {sum(f.stat().st_size for f in target.iterdir()) // 1024} KiB")


#: Benchmark schemes (``--bench``): name -> (modifier, quantization group). The default
#: ones are round-to-nearest: no calibration data, so a 1 B model quantizes in minutes on
#: 2 cores, and speed does not depend on the weight values. The calibrated ones (GPTQ,
#: AWQ) are opt-in with ``--schemes``: they run the tool's real algorithm on a handful of
#: short random sequences (:data:`BENCH_CALIBRATION`), which is slow at 1 B on 2 cores and
#: gives the same packed layout at the same speed (AWQ adds zero points).
BENCH_SCHEMES: dict[str, tuple[str, dict[str, Any]]] = {
    "w4a16-g128": ("rtn", {"weights": _weights(4, "group", 128)}),
    # Zero points (uint4 with weight_zero_point): the layout AWQ writes, without its scaling.
    "w4a16-g128-asym": ("rtn", {"weights": _weights(4, "group", 128, sym=False)}),
    "w8a8-dynamic": ("rtn", {"weights": _weights(8, "channel"),
                             "input_activations": _int8_input("token", True)}),
    "gptq-w4a16-g128": ("gptq", {"weights": _weights(4, "group", 128)}),
    "awq-w4a16-g128-asym": ("awq", {"weights": _weights(4, "group", 128, sym=False)}),
}
#: The schemes ``make bench-models-quant`` builds (data-free).
BENCH_DEFAULT = ["w4a16-g128", "w4a16-g128-asym", "w8a8-dynamic"]
#: Calibration of the calibrated benchmark schemes: (samples, tokens each).
BENCH_CALIBRATION = (8, 64)


def _done(target: Path) -> bool:
    """A finished benchmark checkpoint: its config names a quantization method."""
    try:
        return "quantization_config" in json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return False


def make_bench(source: Path, out_dir: Path, schemes: list[str]) -> None:
    """Quantize a benchmark checkpoint (``make bench-models``' llama-1b-rand) per scheme
    into ``OUT/<source name>-<scheme>``.

    Idempotent: a finished checkpoint is left alone (delete it to remake it). Each one is
    written into ``<target>.part`` and renamed at the end, so an interrupted run is never
    mistaken for a finished checkpoint.
    """
    import time

    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for scheme in schemes:
        target = out_dir / f"{source.name}-{scheme}"
        if _done(target):
            print(f"{target}: already there", flush=True)
            continue
        modifier, group = BENCH_SCHEMES[scheme]
        part = target.with_name(target.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        print(f"{target}: quantizing {source} ({modifier}, {scheme})", flush=True)
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
        if modifier == "rtn":
            oneshot(model=model, recipe=_modifier(modifier, group))
        else:
            n, length = BENCH_CALIBRATION
            oneshot(model=model, dataset=_calibration(n, length),
                    recipe=_modifier(modifier, group), max_seq_length=length,
                    num_calibration_samples=n)
        quantized = time.perf_counter() - start
        model.save_pretrained(part, save_compressed=True)
        AutoTokenizer.from_pretrained(source).save_pretrained(part)
        (part / "recipe.yaml").unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        part.rename(target)
        size = sum(f.stat().st_size for f in target.iterdir()) >> 20
        print(f"{target}: {size} MiB; quantized in {quantized:.0f} s, "
              f"{time.perf_counter() - start:.0f} s in all", flush=True)


#: Classic GPTQ layout (qweight/qzeros/scales/g_idx, checkpoint_format gptq) by GPTQModel,
#: run in its own venv (``--gptqmodel``): name -> (base model, bits, desc_act, sym).
GPTQMODEL_RECIPES: dict[str, tuple[str, int, bool, bool]] = {
    "gptqmodel-w4-g32-asym-desc-act": ("llama", 4, True, False),
    "gptqmodel-w4-g32-sym": ("qwen2", 4, False, True),
}


def make_gptqmodel(name: str, out_dir: Path, work: Path) -> None:
    """GPTQModel's export, with transformers on the weights GPTQModel itself dequantizes
    as the reference (GPTQModel 7.6's own CPU forward of a desc_act layer disagrees with
    its ``dequantize_weight``; the dequantized weights are the format's meaning)."""
    import torch
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoModelForCausalLM

    kind, bits, desc_act, sym = GPTQMODEL_RECIPES[name]
    base = work / f"base-{kind}"
    if not base.exists():
        _base_model(kind, base)
    g = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(3, 384, (48,), generator=g).tolist(),
              "attention_mask": [1] * 48} for _ in range(16)]
    model = GPTQModel.load(str(base), QuantizeConfig(bits=bits, group_size=32,
                                                     desc_act=desc_act, sym=sym), device="cpu")
    model.quantize(calib, batch_size=4)
    target = out_dir / name
    shutil.rmtree(target, ignore_errors=True)
    model.save(str(target))
    (target / "quant_log.csv").unlink(missing_ok=True)
    quantized = GPTQModel.load(str(target), device="cpu", dtype=torch.float32)
    dense = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    state = dense.state_dict()
    with torch.no_grad():
        for mod_name, mod in quantized.model.named_modules():
            if hasattr(mod, "dequantize_weight"):  # [in, out]
                state[f"{mod_name}.weight"].copy_(mod.dequantize_weight().float().t())
                if getattr(mod, "bias", None) is not None:
                    state[f"{mod_name}.bias"].copy_(mod.bias.float())
    dense_dir = work / f"dense-{name}"
    dense.save_pretrained(dense_dir)
    (target / "reference.json").write_text(json.dumps(_reference(dense_dir)) + "\n")
    print(f"{name}: {sum(f.stat().st_size for f in target.iterdir()) // 1024} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", choices=sorted(RECIPES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/glowlm-quant-work"))
    parser.add_argument("--only-gptqmodel", nargs="*", choices=sorted(GPTQMODEL_RECIPES))
    parser.add_argument("--gptqmodel", action="store_true",
                        help="the classic GPTQ fixtures, with GPTQModel (run in its venv)")
    parser.add_argument("--bench", type=Path, metavar="MODEL_DIR",
                        help="quantize this benchmark checkpoint instead of the fixtures")
    parser.add_argument("--schemes", nargs="*", choices=sorted(BENCH_SCHEMES),
                        default=BENCH_DEFAULT,
                        help=f"with --bench (default: the data-free {' '.join(BENCH_DEFAULT)})")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.gptqmodel:
        for name in args.only_gptqmodel or GPTQMODEL_RECIPES:
            make_gptqmodel(name, args.out, args.work)
        return
    if args.bench is not None:
        make_bench(args.bench, args.out, args.schemes)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    for name in args.only or RECIPES:
        make(name, args.out, args.work)


if __name__ == "__main__":
    main()
