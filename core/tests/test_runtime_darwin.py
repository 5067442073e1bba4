"""macOS starts: thread binding degrades where sched_getaffinity, sysfs and NUMA do not exist.

A Darwin host is simulated on Linux by removing ``os.sched_getaffinity`` /
``os.sched_setaffinity`` (macOS's ``os`` module has neither) and hiding sysfs from
the topology reader; the engine test does it in a fresh process so nothing leaks
(there ``sys.platform`` stays ``linux``: the standard library would then import
macOS-only modules).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from glowlm.runtime import binding, topology


@pytest.fixture
def darwin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    monkeypatch.setattr(topology, "_sysfs_present", lambda root: False)
    monkeypatch.setattr(sys, "platform", "darwin")


def test_topology_without_sysfs_or_affinity_counts_cpus(darwin: None) -> None:
    topo = topology.read()
    cpus = os.cpu_count() or 1
    assert topo.online == topo.allowed == tuple(range(cpus))
    assert len(topo.cores) == cpus and len(topo.nodes) == 1 and not topo.smt
    assert topo.cgroup == topology.Cgroup()
    assert not topology.has_affinity()
    assert binding.plan(topo).this.node is None  # one node: memory policy left alone


def test_apply_sets_threads_without_pinning(darwin: None, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    monkeypatch.setattr(binding, "_APPLIED", None)
    before = torch.get_num_threads()
    try:
        p = binding.apply_for_process()
        assert torch.get_num_threads() == len(p.this.cpus)
    finally:
        torch.set_num_threads(before)
    assert any("not pinned" in note and "sched_setaffinity" in note for note in p.applied)
    assert "not pinned" in p.describe()


_ENGINE = """
import os, sys
from glowlm.runtime import topology
del os.sched_getaffinity, os.sched_setaffinity
topology._sysfs_present = lambda root: False
from glowlm import LLM, SamplingParams
llm = LLM(sys.argv[1], platform="generic", dtype="float32")
out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=3))
print("TOKENS", len(out[0].outputs[0].token_ids))
"""


def test_engine_starts_and_generates_on_simulated_darwin(tmp_path: Path) -> None:
    from glowlm.testing.tiny_models import make_tiny_model

    model = make_tiny_model("llama", tmp_path / "llama")
    proc = subprocess.run([sys.executable, "-c", _ENGINE, str(model)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TOKENS 3" in proc.stdout
    assert "not pinned" in proc.stderr
