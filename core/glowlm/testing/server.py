"""Start a real ``glowlm serve`` subprocess for tests and read its metrics.

Tests drive the server over HTTP exactly as users do, so it runs as a separate
process on a free port; this module holds the start/stop/scrape code every
server test file needs. The defaults keep it cheap on a shared machine: a
50 MiB KV cache, one OpenMP thread, no thread binding.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from glowlm.executor.hosts import free_port

#: A hermes-style chat template (as Qwen2.5 / Hermes models ship) for tool-calling tests:
#: tools in the system turn, assistant tool calls as <tool_call> JSON, tool results as
#: <tool_response>.
HERMES_TEMPLATE = """\
{%- if tools %}<|system|>You may call these tools: {{ tools | tojson }}
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>
{%- for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": \
{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}
{% elif m.role == 'tool' %}<|tool|><tool_response>{{ m.content }}</tool_response>
{% else %}<|{{ m.role }}|>{{ m.content }}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def openai_client(server: ServerProcess) -> Any:
    """The official ``openai`` client on the server's /v1 (no retries: a failure shows)."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    """A JSON POST to ``path``, without a client's own checks (bad bodies get through)."""
    return httpx.post(server.url + path, json=body, timeout=60)


#: The KV cache of every server :func:`start_server` starts (GLOWLM_CPU_KVCACHE_SPACE).
KV_CACHE_GIB = 0.05


def start_server(model: str | Path, log: Path, *args: str, timeout: float = 180.0,
                 env: dict[str, str] | None = None) -> ServerProcess:
    """Run ``glowlm serve MODEL ARGS`` on a free port; return once /health answers 200.

    Raises RuntimeError with the end of the server's log if it exits or never
    becomes healthy.
    """
    port = free_port()
    full_env = {**os.environ, "GLOWLM_CPU_KVCACHE_SPACE": f"{KV_CACHE_GIB:g}",
                "GLOWLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                "GLOWLM_DISABLE_KERNELS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "glowlm.entrypoints.cli.main", "serve", str(model),
           "--port", str(port), *args]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, env=full_env, stdout=f, stderr=subprocess.STDOUT)
    server = ServerProcess(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server not healthy after {timeout:.0f} s:\n{server.log_tail()}")


def stop_server(server: ServerProcess, timeout: float = 30.0) -> int | None:
    """SIGTERM (graceful), then SIGKILL after ``timeout``; returns the exit code."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()
    return server.proc.returncode


def scrape_metrics(url: str, model_name: str) -> dict[str, float]:
    """``/metrics`` as ``{name or name{other labels}: value}``, the model label dropped."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            key = key.replace(f'model_name="{model_name}",', "")
            key = key.replace(f',model_name="{model_name}"', "")  # labels come sorted
            key = key.replace(f'{{model_name="{model_name}"}}', "")
            out[key] = float(value)
    return out
