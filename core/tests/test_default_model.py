"""The embedded default model: present, described, and exact against transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from glowlm import LLM, SamplingParams
from glowlm.default_model import default_model_path, describe

PROMPTS = ["def parse_args(argv):", "import os\n\n\nclass Config:", "    for key, value in"]


def test_default_model_is_shipped_and_small():
    info = describe()
    assert info["size_mb"] <= 30
    assert info["training_info"]["params"] > 1_000_000
    assert info["eval"]["heldout_ppl"] < info["eval"]["unigram_ppl"] / 5


def test_greedy_output_equals_transformers():
    """Both in float32: the engine's kernels against transformers' eager model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(dtype="float32", kv_cache_space_gib=0.05, show_progress=False)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = torch.tensor([tok.encode(prompt)])
        ref = hf.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None,
                          pad_token_id=1)[0, ids.shape[1]:].tolist()
        assert out.outputs[0].token_ids == ref


def test_models_verb_lists_it():
    r = subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.main", "models", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["name"] == "glowlm-stdlib-coder" and "eval" in info
