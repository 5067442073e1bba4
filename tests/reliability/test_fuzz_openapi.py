"""Property-based fuzzing of the served ``/openapi.json`` with schemathesis.

Every operation the schema declares is called with requests generated from the
schema, valid ones (positive) and ones violating it (negative); each response
must not be a 5xx, must arrive within the time limit (no hangs), and must
conform to the schema: a declared status, a declared content type, a body
matching the declared JSON schema, declared headers. Bounded: ``SHORT`` cases
per operation and mode (``LONG`` under ``slow``). The strategies are driven
with hypothesis directly (one ``given`` per operation) rather than through
schemathesis' pytest plugin.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from reliability_harness import AUTH, healthy, kv_idle, record, wait_for
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
#: One call longer than this is a hang (the longest legal request, 255 tokens at
#: n=64 on the tiny model, takes a few seconds).
HANG_SECONDS = 60
COUNTS = {"cases": 0, "server_errors": 0, "hangs": 0}
SHORT, LONG = 20, 100


@pytest.fixture(scope="module")
def api_schema(server: Any) -> Any:
    raw = httpx.get(server.url + "/openapi.json", headers=AUTH, timeout=30).json()
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=server.url)
    return schema


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=list(HealthCheck))


def _call(case: Any) -> None:
    COUNTS["cases"] += 1
    try:
        response = case.call(headers=AUTH, timeout=HANG_SECONDS)
    except requests.Timeout:
        COUNTS["hangs"] += 1
        raise AssertionError(f"no answer within {HANG_SECONDS} s: "
                             f"{case.as_curl_command()}") from None
    if response.status_code >= 500:
        COUNTS["server_errors"] += 1
    case.validate_response(response, checks=CHECKS)


def _fuzz(api_schema: Any, examples: int) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @settings(max_examples=examples, **_SETTINGS)
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                _call(case)

            try:
                run()
            except Unsatisfiable:
                # Nothing to violate (a GET without parameters): no negative cases exist.
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label


def test_fuzz_short(api_schema: Any) -> None:
    _fuzz(api_schema, SHORT)


@pytest.mark.slow
def test_fuzz_long(api_schema: Any) -> None:
    _fuzz(api_schema, LONG)


def test_fuzz_left_the_server_healthy(server: Any) -> None:
    """Runs after the fuzz tests (file order): figures, health, nothing left running."""
    record("fuzz_cases", COUNTS["cases"])
    record("fuzz_5xx", COUNTS["server_errors"])
    record("fuzz_hangs", COUNTS["hangs"])
    assert COUNTS["cases"] > 0
    assert COUNTS["server_errors"] == COUNTS["hangs"] == 0
    assert healthy(server)
    assert wait_for(lambda: kv_idle(server), 20) is not None
