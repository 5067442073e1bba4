"""A real third-party plugin, installed with pip, found through its entry point.

tests/example_plugin is installed (editable, no deps) once for this module and
uninstalled afterwards; every check runs glowlm in a fresh subprocess, as a user
would, so discovery goes through the installed distribution's metadata.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parent / "example_plugin"
DIST = "glowlm-example"


def _installed() -> bool:
    try:
        metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return False
    return True


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
                   check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def example_plugin() -> Iterator[None]:
    """Install the example plugin for this module; leave the venv as it was found."""
    was_installed = _installed()
    if not was_installed:
        _pip("install", "--no-build-isolation", "--no-deps", "-e", str(EXAMPLE))
    try:
        yield
    finally:
        if not was_installed:
            _pip("uninstall", "-y", DIST)
            assert not _installed(), f"{DIST} is still installed after the tests"


def glowlm(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GLOWLM_PLATFORM", "GLOWLM_PLUGINS_BLOCK", "GLOWLM_EXAMPLE_RANK")}
    return subprocess.run([sys.executable, "-m", "glowlm.entrypoints.cli.main", *args],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def platforms_json(**env: str) -> dict:
    proc = glowlm("platforms", "--json", **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def example_candidate(data: dict) -> dict:
    return next(c for c in data["candidates"] if c["name"] == "example")


def test_it_is_discovered_and_listed(example_plugin: None) -> None:
    data = platforms_json()
    c = example_candidate(data)
    assert (c["distribution"], c["version"], c["rank"]) == (DIST, "0.1.0", 50)
    assert c["matched"] and "any CPU" in c["reason"]


def test_it_wins_when_ranked_above_the_isa_families(example_plugin: None) -> None:
    data = platforms_json(GLOWLM_EXAMPLE_RANK="300")
    assert data["selected"]["name"] == "example"
    assert "ranks above" in data["selected"]["reason"]
    assert example_candidate(data)["rank"] == 300


def test_it_can_be_forced(example_plugin: None) -> None:
    data = platforms_json(GLOWLM_PLATFORM="example")
    assert data["selected"]["name"] == "example"
    assert data["selected"]["reason"].startswith("forced by the user")


def test_blocked_means_never_imported_and_listed_as_blocked(example_plugin: None) -> None:
    c = example_candidate(platforms_json(GLOWLM_PLUGINS_BLOCK="example"))
    assert not c["matched"] and c["reason"] == "blocked by GLOWLM_PLUGINS_BLOCK"
    probe = ("import sys; from glowlm.platforms import current_selection; "
             "current_selection(); print('glowlm_example' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLOWLM_")}

    def imported(**extra: str) -> str:
        return subprocess.run([sys.executable, "-c", probe], env={**env, **extra},
                              capture_output=True, text=True, check=True).stdout.strip()

    assert imported() == "True"
    assert imported(GLOWLM_PLUGINS_BLOCK="example") == "False"


def test_the_plugins_own_tests_pass_when_installed(example_plugin: None) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(EXAMPLE / "tests")], capture_output=True, text=True,
                          timeout=300, cwd=EXAMPLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
