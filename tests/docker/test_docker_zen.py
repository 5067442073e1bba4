"""The zen image (docker/Dockerfile's ``zen`` target: the cpu image plus
glowlm-zen[zentorch]), built and served through Docker (docs/docker.md).

It must hold zentorch beside the x86 kernels and serve the default model. Which platform
serves depends on the host, as for a user: zen on an AMD CPU with AVX-512 (Zen 4/5,
zentorch's linear), x86 elsewhere (the image still runs; zentorch then only loads).
"""

from __future__ import annotations

import json
from pathlib import Path

import docker_harness as harness
import openai
import pytest

pytestmark = pytest.mark.docker

MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the capital of France? Answer in one sentence."


def expected_platform() -> str:
    text = Path("/proc/cpuinfo").read_text()
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return "zen" if "AuthenticAMD" in text and "avx512f" in flags else "x86"


def test_the_zen_image_holds_zentorch_and_the_x86_kernels(
    docker: harness.Docker, zen_image: str
) -> None:
    out = docker(
        "run",
        "--rm",
        "--entrypoint",
        "python",
        zen_image,
        "-c",
        (
            "import json, pathlib, torch, zentorch, glowlm_zen, glowlm_x86\n"
            "d = pathlib.Path(glowlm_x86.__file__).parent\n"
            "print(json.dumps({'torch': torch.__version__, 'zentorch': zentorch.__version__,\n"
            "  'modules': sorted(p.name.split('.')[0] for p in d.glob('_kernels_*.so'))}))"
        ),
        timeout=300,
    ).stdout
    info = json.loads(out.strip().splitlines()[-1])
    assert info["torch"].startswith("2.13.0"), info
    assert info["zentorch"].startswith("2.13"), info
    assert info["modules"] == ["_kernels_avx2", "_kernels_avx512", "_kernels_avx512_bf16"]
    platforms = docker("run", "--rm", zen_image, "platforms", "--json", timeout=300).stdout
    assert json.loads(platforms)["selected"]["name"] == expected_platform()


def test_the_zen_image_serves_the_default_model(docker: harness.Docker, zen_image: str) -> None:
    c = harness.run_server(docker, "glowlm-test-zen", [], [], image=zen_image)
    try:
        api = openai.OpenAI(base_url=c.url + "/v1", api_key="unused", timeout=300, max_retries=0)
        chat = api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=24,
            temperature=0,
        )
        assert "Paris" in (chat.choices[0].message.content or "")
        assert f"platform {expected_platform()}" in c.logs()
    finally:
        c.remove()
