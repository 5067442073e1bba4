"""``glowlm serve`` with no MODEL serves the default model (SmolLM2-135M-Instruct) and
answers the official ``openai`` client's chat request correctly, over real HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from glowlm.errors import ModelLoadError
from glowlm.testing.server import free_port


def test_serve_without_a_model_answers_a_chat_question(tmp_path):
    from glowlm.default_model import default_model_file

    try:
        default_model_file()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    openai = pytest.importorskip("openai")
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "GLOWLM_CPU_KVCACHE_SPACE": "0.1", "GLOWLM_CPU_OMP_THREADS_BIND": "nobind"}
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "glowlm.entrypoints.cli.main", "serve",
                                 "--port", str(port)], env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        models = [m.id for m in client.models.list().data]
        assert models == ["SmolLM2-135M-Instruct"]
        reply = client.chat.completions.create(
            model=models[0], temperature=0, max_tokens=32,
            messages=[{"role": "user",
                       "content": "What is the capital of France? Answer in one sentence."}])
        choice = reply.choices[0]
        assert "Paris" in choice.message.content and choice.finish_reason == "stop"
        assert "default model SmolLM2-135M-Instruct" in log.read_text()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
