"""Print the reliability figures of a run (``make test-reliability`` ends with these lines).

Usage: python tests/reliability/report.py REPORT.json [HOST-NOTE]

REPORT.json is what the tests wrote through ``GLOWLM_RELIABILITY_REPORT``. The
last lines are the issue's figures: bad-input kinds and 5xx, fuzz cases and
5xx/hangs, soak requests/errors/RSS growth, disconnect-storm blocks freed.
Exits 1 when a figure is missing (a test did not run) or is not what passing means.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(".reliability.json")
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def get(name: str) -> Any:
        return data.get(name, "missing")

    soak = "long" if "soak_long_requests" in data else "short"
    print(f"reliability figures ({_cpu()}):")
    for name in sorted(data):
        print(f"  {name}: {data[name]}")
    lines = [
        f"bad input: {get('bad_input_kinds')} kinds tried, {get('bad_input_5xx')} x 5xx",
        f"fuzz: {get('fuzz_cases')} schemathesis cases, {get('fuzz_5xx')} x 5xx, "
        f"{get('fuzz_hangs')} hangs",
        f"soak ({soak}, {get(f'soak_{soak}_seconds')} s): {get(f'soak_{soak}_requests')} "
        f"requests, {get(f'soak_{soak}_errors')} errors, RSS growth "
        f"{get(f'soak_{soak}_rss_growth_pct')} %, p50/p99 "
        f"{get(f'soak_{soak}_latency_p50_s')}/{get(f'soak_{soak}_latency_p99_s')} s",
        f"disconnect storm: {get('storm_streams')} streams, KV blocks freed "
        f"{get('storm_blocks_freed')} in {get('storm_seconds_to_idle')} s",
    ]
    for line in lines:
        print(line)
    ok = (get("bad_input_5xx") == 0 and get("fuzz_5xx") == 0 and get("fuzz_hangs") == 0
          and get(f"soak_{soak}_errors") == 0
          and isinstance(get(f"soak_{soak}_rss_growth_pct"), (int, float))
          and get(f"soak_{soak}_rss_growth_pct") < 5
          and isinstance(get("storm_blocks_freed"), str)
          and len(set(get("storm_blocks_freed").split("/"))) == 1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
