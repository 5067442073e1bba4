"""The Arm plugin as an aarch64 server runs it: inside the emulated arm64 root of
``make test-arm64`` (tools/arm64_root.py), with PyPI's aarch64 torch and the plugin's
compiled extension. Collected anywhere else, every test skips with the reason.

What runs under qemu proves the plumbing and the NEON (and BF16) arithmetic qemu
implements, not Arm speed. Checked here, beyond the plugin's own tests:

- the platform selected is ``arm`` with the ISA of the emulated CPU, and its kernels
  come from the installed module (``glowlm_arm/_kernels_<isa>``), not a run-time build;
- greedy parity with core's reference platform (``generic``) on a tiny random Llama
  (fp32), and with the reference quantized matmuls on real GPTQ/compressed-tensors checkpoints
  (made by the real tools, core/tests/fixtures/quant);
- ``glowlm serve`` answering the official ``openai`` client over real HTTP.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CPU = os.environ.get("GLOWLM_ARM64_CPU", "")
pytestmark = pytest.mark.skipif(
    platform.machine() != "aarch64" or not CPU,
    reason="runs inside make test-arm64's emulated arm64 root (tools/arm64_root.py)")

FIXTURES = Path(__file__).resolve().parents[2] / "core/tests/fixtures/quant"
ENGINE = dict(kv_cache_space_gib=0.05, block_size=32, show_progress=False,
              max_model_len=128)
PROMPTS = ([5, 17, 42, 99, 7], [3] * 21, list(range(3, 40)))


def _arm():  # noqa: ANN202 - the Arm plugin's platform, as selection builds it
    from glowlm.platforms.selection import select_platform
    from glowlm.plugin_api import live_host

    selected = select_platform(live_host())
    assert selected.platform.name == "arm", selected.reason
    return selected.platform


def _greedy(model: Path | str, platform_name: str, dtype: str, n: int = 8) -> list[list[int]]:
    from glowlm import LLM, SamplingParams

    llm = LLM(str(model), platform=platform_name, dtype=dtype, **ENGINE)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from glowlm.testing.tiny_models import make_tiny_model

    return make_tiny_model("llama", tmp_path_factory.mktemp("arm64-llama"))


def test_the_arm_platform_runs_its_installed_module() -> None:
    arm = _arm()
    assert arm.capabilities.isa == CPU
    kernels = arm.compiled()
    assert kernels is not None, arm.kernel_note()
    library = kernels.library()
    assert library is not None and library.isa == CPU
    assert library.prebuilt, f"a run-time build, not the installed module: {library.path}"
    assert library.path.name.startswith("_kernels_" + CPU.replace("-", "_"))
    assert "rms_norm" in arm.capabilities.kernels


def test_tiny_llama_greedy_matches_the_reference(tiny_llama: Path) -> None:
    """fp32 only: bf16 kernels sum in another order than torch's, and a random tiny
    model's near-tied logits then flip greedy tokens; the contract suite holds the bf16
    ops to tolerances on neon-bf16."""
    assert _greedy(tiny_llama, "arm", "float32") == _greedy(tiny_llama, "generic", "float32")


def _reference_greedy(model: Path, dtype: str, n: int) -> list[list[int]]:
    """The Arm platform with GLOWLM_DISABLE_KERNELS=1 (core's reference quantized matmuls;
    the generic platform declares no quantization), in its own process: this one has
    the module loaded already."""
    code = ("import json, sys; sys.path.insert(0, 'tests/arm64'); import test_arm64 as t; "
            f"print(json.dumps(t._greedy({str(model)!r}, 'arm', {dtype!r}, {n})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "GLOWLM_DISABLE_KERNELS": "1"}, timeout=1800,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("checkpoint", ["gptq-w4a16-g32-sym", "w8a8-dynamic"])
def test_quantized_checkpoint_greedy_matches_the_reference(checkpoint: str) -> None:
    """The compiled wna16 / w8a8 kernels against core's reference quantized matmuls."""
    path = FIXTURES / checkpoint
    assert path.is_dir(), f"missing fixture {path}"
    assert _greedy(path, "arm", "float32", 6) == _reference_greedy(path, "float32", 6)


def test_serve_answers_the_openai_client(tiny_llama: Path, tmp_path: Path) -> None:
    from glowlm.testing.server import openai_client, start_server, stop_server

    server = start_server(tiny_llama, tmp_path / "serve.log", "--dtype", "float32",
                          timeout=900, env={"GLOWLM_DISABLE_KERNELS": "0"})
    try:
        out = openai_client(server).completions.create(
            model=str(tiny_llama), prompt="hello there", max_tokens=5, temperature=0)
        assert out.choices[0].text is not None
        assert out.usage.completion_tokens == 5
        log = server.log_tail(20000)
        assert "arm" in log and CPU in log, log
    finally:
        assert stop_server(server) == 0, server.log_tail()


def test_torch_is_the_aarch64_build() -> None:
    assert torch.__version__.startswith("2.13.0")
    assert platform.machine() == "aarch64"
