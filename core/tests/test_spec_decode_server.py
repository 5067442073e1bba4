"""``glowlm serve --speculative-config``: the openai client gets the plain engine's
greedy text, and /metrics shows vLLM's speculative-decoding counters."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from glowlm import LLM, SamplingParams
from glowlm.testing.server import ServerProcess, scrape_metrics, start_server, stop_server
from glowlm.testing.tiny_models import SMALL_ENGINE, make_tiny_model

MODEL = "tiny-spec"
CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 2,
    "adaptive": False,
}
PROMPT = "def hello(self): return hello(self) def hello(self): return hello(self) def"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tiny_model("llama", tmp_path_factory.mktemp("spec") / "llama"))


@pytest.fixture(scope="module")
def server(model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("spec-server") / "server.log"
    srv = start_server(
        model,
        log,
        "--block-size",
        "32",
        "--served-model-name",
        MODEL,
        "--speculative-config",
        json.dumps(CONFIG),
    )
    yield srv
    stop_server(srv)


def test_completions_equal_the_plain_engine_and_metrics_count_drafts(model, server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    plain = (
        LLM(model, platform="generic", **SMALL_ENGINE)
        .generate(
            PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False
        )[0]
        .outputs[0]
    )
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].text == plain.text
    assert out.usage is not None and out.usage.completion_tokens == 40
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=40,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].text for c in stream) == plain.text
    m = scrape_metrics(server.url, MODEL)
    for prefix in ("vllm", "glowlm"):
        drafts = m[f"{prefix}:spec_decode_num_drafts_total"]
        drafted = m[f"{prefix}:spec_decode_num_draft_tokens_total"]
        accepted = m[f"{prefix}:spec_decode_num_accepted_tokens_total"]
        assert drafts > 0 and drafted >= drafts and 0 < accepted <= drafted
        per_pos = [
            m[f'{prefix}:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}']
            for i in range(3)
        ]
        assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
