"""A real third-party plugin, from outside the repository, installed with pip.

examples/glowlm-example is copied to a temporary directory (so nothing can reach
core's source tree by a relative path), pip-installed from there into this venv
(``--no-build-isolation --no-deps``: its compiled op is built against this torch)
once for the module, and uninstalled afterwards. Every check runs glowlm in a fresh
subprocess, as a user would: discovery goes through the installed distribution's
metadata, the plugin's own tests (its compiled op with ``opcheck``, glowlm's shipped
contract suite) run against the installed package, and ``glowlm serve`` answers a
chat request on the example platform.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "glowlm-example"
DIST = "glowlm-example"


def _installed() -> bool:
    try:
        metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return False
    return True


def _pip(*args: str, cwd: Path | None = None) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--quiet",
                           "--disable-pip-version-check"],
                          capture_output=True, text=True, cwd=cwd, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def example_copy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The template copied outside the repository and installed from there (uninstalled
    afterwards; a copy the developer installed already is used as it is)."""
    copy = tmp_path_factory.mktemp("third-party") / "glowlm-example"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "*.so"))
    was_installed = _installed()
    if not was_installed:
        _pip("install", "--no-build-isolation", "--no-deps", str(copy), cwd=copy.parent)
    try:
        yield copy
    finally:
        if not was_installed:
            _pip("uninstall", "-y", DIST)
            assert not _installed(), f"{DIST} is still installed after the tests"


def _clean_env(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GLOWLM_PLATFORM", "GLOWLM_PLUGINS_BLOCK", "GLOWLM_EXAMPLE_RANK")}
    return {**clean, **env}


def glowlm(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.main", *args],
                          env=_clean_env(**env), capture_output=True, text=True, timeout=120,
                          cwd="/")


def platforms_json(**env: str) -> dict:
    proc = glowlm("platforms", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def example_candidate(data: dict) -> dict:
    return next(c for c in data["candidates"] if c["name"] == "example")


def test_it_is_discovered_and_listed_with_its_op_and_setting(example_copy: Path) -> None:
    data = platforms_json()
    c = example_candidate(data)
    assert (c["distribution"], c["version"], c["rank"]) == (DIST, "0.1.0", 50)
    assert c["matched"] and "any CPU" in c["reason"]
    assert c["kernels"] == ["glowlm_example::rms_norm"]
    assert c["dtypes"] == ["float32", "bfloat16"] and c["quantization"] == []
    setting = next(s for s in data["settings"] if s["name"] == "GLOWLM_EXAMPLE_RANK")
    assert setting["plugin"] == "example" and setting["default"] == "50"
    text = glowlm("platforms").stdout
    assert "example    GLOWLM_EXAMPLE_RANK=50" in text


def test_it_is_installed_from_outside_the_repository(example_copy: Path) -> None:
    import glowlm as core

    probe = "import glowlm_example.ops as ops; print(ops.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, cwd="/").stdout.strip()
    assert "site-packages" in Path(where).parts, where  # a real install, not a path
    assert not Path(where).is_relative_to(EXAMPLE) and not Path(where).is_relative_to(
        example_copy), where
    assert not Path(core.__file__).is_relative_to(example_copy)


def test_it_wins_when_ranked_above_the_isa_families(example_copy: Path) -> None:
    data = platforms_json(GLOWLM_EXAMPLE_RANK="300")
    assert data["selected"]["name"] == "example"
    assert "ranks above" in data["selected"]["reason"]
    assert example_candidate(data)["rank"] == 300


def test_it_can_be_forced(example_copy: Path) -> None:
    data = platforms_json(GLOWLM_PLATFORM="example")
    assert data["selected"]["name"] == "example"
    assert data["selected"]["reason"].startswith("forced by the user")


def test_blocked_means_never_imported_and_listed_as_blocked(example_copy: Path) -> None:
    c = example_candidate(platforms_json(GLOWLM_PLUGINS_BLOCK="example"))
    assert not c["matched"] and c["reason"] == "blocked by GLOWLM_PLUGINS_BLOCK"
    probe = ("import sys; from glowlm.platforms import current_selection; "
             "current_selection(); print('glowlm_example' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLOWLM_")}

    def imported(**extra: str) -> str:
        return subprocess.run([sys.executable, "-c", probe], env={**env, **extra},
                              capture_output=True, text=True, check=True, cwd="/"
                              ).stdout.strip()

    assert imported() == "True"
    assert imported(GLOWLM_PLUGINS_BLOCK="example") == "False"


def test_its_own_tests_pass_the_shipped_contract_suite(example_copy: Path) -> None:
    # The plugin's tests, from the copy, against the installed package: detection on
    # glowlm's recorded hosts, the compiled op (opcheck), and glowlm.testing.contract.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--import-mode=importlib", "--rootdir", str(example_copy),
         str(example_copy / "tests")],
        env=_clean_env(OMP_NUM_THREADS="1", GLOWLM_CPU_OMP_THREADS_BIND="nobind"),
        capture_output=True, text=True, timeout=900, cwd=example_copy.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, summary
    assert "test_contract.py" not in proc.stdout or "FAILED" not in proc.stdout


def test_glowlm_serve_answers_a_chat_request_on_it(example_copy: Path, tmp_path: Path) -> None:
    import openai
    from glowlm.testing.server import start_server, stop_server
    from glowlm.testing.tiny_models import make_tiny_model

    model = make_tiny_model("llama", tmp_path / "tiny-llama")
    server = start_server(model, tmp_path / "serve.log", "--max-model-len", "256",
                          env=_clean_env(GLOWLM_PLATFORM="example", GLOWLM_DISABLE_KERNELS="0"))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, max_tokens=5, temperature=0,
            messages=[{"role": "user", "content": "def add(a, b):"}])
        assert reply.choices[0].finish_reason in ("length", "stop")
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        assert reply.choices[0].message.content is not None
    finally:
        stop_server(server)
    log = server.log.read_text(errors="replace")
    assert "platform example" in log, log[-3000:]


def test_the_template_builds_in_isolation_against_glowlms_torch() -> None:
    """Plain ``pip install .`` builds in an isolated environment: its torch is the build
    requirement, pinned to the torch glowlm runs on (the op's ABI), and the C++ standard
    is the one torch's own extension builds use for its headers (setuptools passes none,
    and g++'s default C++17 does not build torch 2.13's). The isolated build itself ran
    once by hand (docs/writing-a-plugin.md): it installs a whole torch."""
    import inspect
    import re
    import tomllib

    import torch
    from torch.utils import cpp_extension

    requires = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["build-system"][
        "requires"]
    public = torch.__version__.split("+")[0]
    assert f"torch=={public}" in requires, requires
    standards = set(re.findall(r"-std=c\+\+\d+", inspect.getsource(cpp_extension)))
    args = re.search(r"extra_compile_args=\[([^\]]*)\]", (EXAMPLE / "setup.py").read_text())
    assert args is not None
    assert re.findall(r"-std=c\+\+\d+", args.group(1)) == [max(standards)], standards
