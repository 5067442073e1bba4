"""The Docker tests: run by `make test-docker`, kept out of `make test` (docs/docker.md).

They build the image (the kernels compile inside: minutes on 2 cores) and start
containers, so they are marked ``docker`` and deselected unless the marker expression
names ``docker`` (``pytest -m docker tests/docker``). Without a usable Docker engine
they skip with one line saying why (docker_harness.connect).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import docker_harness as harness  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docker: builds and runs the Docker image; "
                                       "run with `make test-docker`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "docker" in (config.option.markexpr or ""):
        return
    dropped = [i for i in items if i.get_closest_marker("docker") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i.get_closest_marker("docker") is None]


@pytest.fixture(scope="session")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Docker]:
    try:
        d = harness.connect(tmp_path_factory.mktemp("dockerd"))
    except harness.Unavailable as exc:
        pytest.skip(f"Docker tests skipped: {exc}")
    yield d
    d.stop_daemon()


@pytest.fixture(scope="session")
def image(docker: harness.Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The cpu target, built now (BuildKit's layer cache makes a rebuild quick)."""
    log = tmp_path_factory.mktemp("build") / "build-cpu.log"
    try:
        took = harness.build(docker, "cpu", harness.IMAGE, log)
    except harness.Unavailable as exc:
        pytest.skip(f"Docker tests skipped: {exc}")
    cached = sum(1 for line in log.read_text().splitlines() if line.endswith(" CACHED"))
    harness.FIGURES["docker build --target cpu"] = f"{took:.0f} s ({cached} steps cached)"
    return harness.IMAGE


@pytest.fixture(scope="session")
def zen_image(docker: harness.Docker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The zen target (the cpu image's venv plus glowlm-zen[zentorch]), built now."""
    log = tmp_path_factory.mktemp("build") / "build-zen.log"
    try:
        took = harness.build(docker, "zen", harness.ZEN_IMAGE, log)
    except harness.Unavailable as exc:
        pytest.skip(f"Docker tests skipped: {exc}")
    cached = sum(1 for line in log.read_text().splitlines() if line.endswith(" CACHED"))
    harness.FIGURES["docker build --target zen"] = f"{took:.0f} s ({cached} steps cached)"
    return harness.ZEN_IMAGE


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if harness.FIGURES:
        terminalreporter.section("docker figures")
        for name, value in harness.FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
