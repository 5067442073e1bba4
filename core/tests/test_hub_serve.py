"""``glowlm serve ORG/NAME`` as users run it: a real server process that downloads its
model from a Hub (glowlm.testing.hub_server, over HF_ENDPOINT), serves it with the
official openai client, and starts again offline from the cache."""

from __future__ import annotations

import pytest
from glowlm import LLM, SamplingParams
from glowlm.testing.hub_server import HubServer
from glowlm.testing.server import openai_client, start_server, stop_server
from glowlm.testing.tiny_gguf import write_tiny_gguf
from glowlm.testing.tiny_models import make_tiny_model

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-hub")
    llama = make_tiny_model("llama", root / "llama")
    qwen2 = make_tiny_model("qwen2", root / "qwen2")
    with HubServer() as server:
        server.add_directory("acme/tiny-llama", llama, extra={"pytorch_model.bin": b"x" * 64})
        files = {}
        for qtype in ("Q4_0", "Q8_0"):
            path = write_tiny_gguf(qwen2, root / f"tiny-qwen2-{qtype}.gguf", qtype)
            files[path.name] = path.read_bytes()
        server.add_files("acme/tiny-qwen2-GGUF", files)
        server.dirs = {"llama": llama, "gguf": root}  # type: ignore[attr-defined]
        yield server


def _env(hub, tmp_path, **extra: str) -> dict[str, str]:
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "GLOWLM_GGUF_CACHE": str(tmp_path / "gguf-cache"),
        "HF_TOKEN": "",
        **extra,
    }


def _complete(server, model: str) -> str:
    out = openai_client(server).completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0
    )
    return out.choices[0].text


def _reference(model: str, monkeypatch, tmp_path) -> str:
    """The same model loaded in-process as the server runs it (reference kernels)."""
    monkeypatch.setenv("GLOWLM_DISABLE_KERNELS", "1")
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))
    llm = LLM(model, kv_cache_space_gib=0.05, show_progress=False)
    return (
        llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
        .outputs[0]
        .text
    )


def test_serve_downloads_then_starts_offline_from_the_cache(hub, tmp_path, monkeypatch):
    want = _reference(str(hub.dirs["llama"]), monkeypatch, tmp_path)
    server = start_server("acme/tiny-llama", tmp_path / "first.log", env=_env(hub, tmp_path))
    try:
        assert _complete(server, "acme/tiny-llama") == want
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert "downloading acme/tiny-llama (revision main" in log and hub.url in log
    assert "downloaded acme/tiny-llama: 0.5 MB in" in log  # progress, as log lines here
    assert not hub.downloads("pytorch_model.bin")
    hub.requests.clear()
    server = start_server(
        "acme/tiny-llama", tmp_path / "second.log", env=_env(hub, tmp_path, HF_HUB_OFFLINE="1")
    )
    try:
        assert _complete(server, "acme/tiny-llama") == want
    finally:
        stop_server(server)
    assert hub.requests == []  # offline: the cache only


def test_serve_a_quant_tag_loads_that_gguf_file(hub, tmp_path, monkeypatch):
    want = _reference(str(hub.dirs["gguf"] / "tiny-qwen2-Q4_0.gguf"), monkeypatch, tmp_path)
    spec = "acme/tiny-qwen2-GGUF:Q4_0"
    hub.requests.clear()
    server = start_server(spec, tmp_path / "gguf.log", env=_env(hub, tmp_path))
    try:
        assert [m.id for m in openai_client(server).models.list()] == [spec]
        assert _complete(server, spec) == want
    finally:
        stop_server(server)
    log = server.log.read_text()
    assert "GGUF file tiny-qwen2-Q4_0.gguf" in log
    assert "snapshots" in log and "tiny-qwen2-Q4_0.gguf" in log.split("loaded ", 1)[1]
    assert [r.path.rsplit("/", 1)[-1] for r in hub.downloads()] == ["tiny-qwen2-Q4_0.gguf"]
