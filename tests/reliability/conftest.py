"""Fixtures of the reliability suite: one tiny model, one shared server, the figures summary.

The shared server runs at 64 sequences per step (the disconnect storm needs 64
streams at once), a 256-token context (fuzzed ``max_tokens`` stay short) and
short HTTP timeouts (the slow-client tests wait for them). Tests that stop
their server (SIGTERM) or need other settings (the soak) start their own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The tests import the harness by name; under --import-mode=importlib that needs its
# directory on sys.path.
sys.path.insert(0, str(Path(__file__).parent))

import reliability_harness as harness  # noqa: E402
from glowlm.testing.server import ServerProcess, stop_server  # noqa: E402
from glowlm.testing.tiny_models import make_tiny_model  # noqa: E402
from reliability_harness import (  # noqa: E402
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("reliability") / "llama")


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("reliability-server") / "server.log"
    srv = harness.serve(tiny_model, log, "--block-size", "32",
                        "--max-num-seqs", str(MAX_NUM_SEQS),
                        "--max-model-len", str(MAX_MODEL_LEN),
                        "--request-header-timeout", str(HEADER_TIMEOUT),
                        "--request-body-timeout", str(BODY_TIMEOUT),
                        "--disable-access-log")
    yield srv
    code = stop_server(srv)
    assert "unhandled error" not in srv.log.read_text(), srv.log_tail()
    assert code == 0, srv.log_tail()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if harness.FIGURES:
        terminalreporter.section("reliability figures")
        for name, value in sorted(harness.FIGURES.items()):
            terminalreporter.write_line(f"{name}: {value}")
