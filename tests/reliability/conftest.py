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

sys.path.insert(0, str(Path(__file__).parent))  # `import helpers` under importlib mode

import helpers  # noqa: E402
from glowlm.testing.server import ServerProcess, stop_server  # noqa: E402
from glowlm.testing.tiny_models import make_tiny_model  # noqa: E402

#: The shared server's settings, which some tests need to know.
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 256
HEADER_TIMEOUT = 3.0
BODY_TIMEOUT = 3.0


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("llama", tmp_path_factory.mktemp("reliability") / "llama")


@pytest.fixture(scope="session")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("reliability-server") / "server.log"
    srv = helpers.serve(tiny_model, log, "--block-size", "32",
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
    if helpers.FIGURES:
        terminalreporter.section("reliability figures")
        for name, value in sorted(helpers.FIGURES.items()):
            terminalreporter.write_line(f"{name}: {value}")
