"""Binding plans on recorded machines (pure), and applying one in a real child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from glowlm.errors import ConfigError
from glowlm.runtime import topology
from glowlm.runtime.binding import BindingPlan, default_reserved, parse_lists, plan
from glowlm.runtime.topology import format_cpulist

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"


def topo(name: str) -> topology.Topology:
    return topology.read(SYSFS / name)


def cpus(p: BindingPlan, rank: int = 0) -> str:
    return format_cpulist(p.ranks[rank].cpus)


# --- auto ---------------------------------------------------------------------------------

def test_two_socket_one_rank_one_thread_per_core_on_node0() -> None:
    p = plan(topo("two-socket-skylake-smt"))
    assert (cpus(p), p.this.node, p.num_threads, p.reserved_cpus) == ("0-15", 0, 16, ())
    assert any("nodes 1 stay idle" in n and "--tensor-parallel-size 2" in n for n in p.notes)
    assert any("SMT siblings" in n for n in p.notes)


def test_two_socket_two_ranks_one_node_each() -> None:
    p = plan(topo("two-socket-skylake-smt"), num_ranks=2, rank=1)
    assert [cpus(p, r) for r in (0, 1)] == ["0-15", "16-31"]
    assert [r.node for r in p.ranks] == [0, 1]
    assert p.this.rank == 1 and p.this.cpus[0] == 16


def test_serving_one_rank_reserves_one_core_for_the_front_end() -> None:
    p = plan(topo("two-socket-skylake-smt"), serving=True)
    assert cpus(p) == "0-14" and p.reserved_cpus == (15, 47)  # the whole core, both siblings
    assert "left for the front-end" in p.describe()


def test_explicit_reserved_comes_from_the_last_rank() -> None:
    p = plan(topo("two-socket-skylake-smt"), reserved=2, num_ranks=2)
    assert [cpus(p, r) for r in (0, 1)] == ["0-15", "16-29"]
    assert format_cpulist(p.reserved_cpus) == "30-31,62-63"


def test_reserved_zero_overrides_the_serving_default() -> None:
    assert plan(topo("laptop-alderlake-hybrid"), reserved=0, serving=True).reserved_cpus == ()


@pytest.mark.parametrize("allowed,ranks,serving,expected", [
    (2, 1, True, 0), (3, 1, True, 1), (64, 1, True, 1), (64, 1, False, 0), (64, 2, True, 0)])
def test_default_reserved(allowed: int, ranks: int, serving: bool, expected: int) -> None:
    assert default_reserved(allowed, ranks, serving) == expected


def test_too_many_reserved_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="GLOWLM_CPU_NUM_OF_RESERVED_CPU=12 leaves rank 0 no"):
        plan(topo("laptop-alderlake-hybrid"), reserved=12)


def test_hybrid_laptop_uses_every_core_and_binds_no_memory() -> None:
    p = plan(topo("laptop-alderlake-hybrid"))
    assert cpus(p) == "0,2,4,6,8-15" and p.this.node is None
    served = plan(topo("laptop-alderlake-hybrid"), serving=True)
    assert cpus(served) == "0,2,4,6,8-14" and served.reserved_cpus == (15,)


def test_small_vm_serving_reserves_nothing() -> None:
    p = plan(topo("kvm-epyc-2vcpu"), serving=True)
    assert cpus(p) == "0-1" and p.reserved_cpus == () and p.this.node is None


def test_container_respects_cpuset_and_quota() -> None:
    t = topo("container-cpuset")
    one = plan(t)
    assert cpus(one) == "2-7" and one.this.node == 0  # 8 cores on node 0, quota 6
    assert any("quota 6" in n for n in one.notes)
    two = plan(t, num_ranks=2)
    assert [cpus(two, r) for r in (0, 1)] == ["2-4", "20-22"]
    assert [r.node for r in two.ranks] == [0, 1]


def test_snc_ranks_spread_over_sockets_first() -> None:
    t = topo("two-socket-snc2")
    two = plan(t, num_ranks=2)
    assert [r.node for r in two.ranks] == [0, 2]  # one per socket, not both on socket 0
    four = plan(t, num_ranks=4)
    assert [cpus(four, r) for r in range(4)] == ["0-5", "6-11", "12-17", "18-23"]
    eight = plan(t, num_ranks=8)
    assert [cpus(eight, r) for r in range(2)] == ["0-2", "3-5"]
    assert [r.node for r in eight.ranks] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_more_ranks_than_cores_in_a_node_is_an_error() -> None:
    with pytest.raises(ConfigError, match="share NUMA node 0, which has only 2"):
        plan(topo("kvm-epyc-2vcpu"), num_ranks=3)


# --- explicit lists ---------------------------------------------------------------------

def test_explicit_lists_one_per_rank() -> None:
    p = plan(topo("two-socket-skylake-smt"), "0-15|16-31", num_ranks=2)
    assert p.mode == "list" and [r.node for r in p.ranks] == [0, 1]
    assert p.ranks[0].cpus == tuple(range(16))


def test_explicit_list_spanning_nodes_binds_no_memory() -> None:
    p = plan(topo("two-socket-skylake-smt"), "0-31|32-63", num_ranks=2)
    assert p.ranks[0].node is None and p.num_threads == 32
    assert any("span NUMA nodes [0, 1]" in n for n in p.notes)


def test_explicit_list_outside_the_cpuset_names_the_cpus_and_the_allowed_set() -> None:
    with pytest.raises(ConfigError) as err:
        plan(topo("container-cpuset"), "0-7")
    msg = str(err.value)
    assert "0-1" in msg and "may not use" in msg
    assert "allowed CPUs (cgroup cpuset): 2-9,20-23,34-37" in msg


def test_explicit_list_beyond_the_machine() -> None:
    with pytest.raises(ConfigError, match="CPU\\(s\\) 2-3 this process may not use"):
        plan(topo("kvm-epyc-2vcpu"), "0-3")


def test_list_count_must_match_ranks() -> None:
    with pytest.raises(ConfigError, match="has 2 CPU list\\(s\\) but there are 1 rank"):
        plan(topo("two-socket-skylake-smt"), "0-15|16-31")


def test_overlapping_lists_rejected() -> None:
    with pytest.raises(ConfigError, match="ranks 0 and 1"):
        plan(topo("two-socket-skylake-smt"), "0-16|16-31", num_ranks=2)


@pytest.mark.parametrize("raw", ["abc", "0-3|", "3-1", "auto|0"])
def test_bad_list_syntax(raw: str) -> None:
    with pytest.raises(ConfigError, match="is not a CPU list"):
        parse_lists(raw)


def test_reserved_ignored_with_lists_is_said() -> None:
    p = plan(topo("kvm-epyc-2vcpu"), "0", reserved=1)
    assert any("ignored" in n for n in p.notes) and p.reserved_cpus == ()


# --- nobind, describe -------------------------------------------------------------------

def test_nobind_touches_nothing() -> None:
    p = plan(topo("two-socket-skylake-smt"), "nobind", num_ranks=2)
    assert p.num_threads is None and all(r.cpus == () and r.node is None for r in p.ranks)
    assert "nobind" in p.describe()


def test_rank_out_of_range() -> None:
    with pytest.raises(ConfigError, match="rank 2"):
        plan(topo("kvm-epyc-2vcpu"), rank=2, num_ranks=2)


def test_describe_is_one_line() -> None:
    line = plan(topo("two-socket-skylake-smt"), num_ranks=2, serving=True).describe()
    assert "\n" not in line
    assert line.startswith("thread binding auto: rank 0 of 2: 16 OpenMP threads on CPUs 0-15")
    assert "NUMA node 0" in line


# --- applied for real, in a child (affinity is per process) -----------------------------

CHILD = r"""
import glob, json, torch
from glowlm.runtime import binding
first = binding.apply_for_process(serving=True)
again = binding.apply_for_process(num_ranks=4)
torch.mm(torch.randn(256, 256), torch.randn(256, 256))  # torch reuses the pinned pool
tasks = {}
for status in glob.glob("/proc/self/task/*/status"):
    fields = dict(l.split(":", 1) for l in open(status) if ":" in l)
    tasks[status.split("/")[4]] = fields["Cpus_allowed_list"].strip()
print(json.dumps({"line": first.describe(), "same": again is first,
                  "threads": torch.get_num_threads(), "tasks": tasks,
                  "cpus": list(first.this.cpus)}))
"""


def test_apply_pins_each_openmp_thread_once_per_process() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "GLOWLM_CPU_OMP_THREADS_BIND":
                                           "auto", "GLOWLM_LOG_LEVEL": "WARNING"})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same"] and got["threads"] == len(got["cpus"])
    assert "pinned one per CPU" in got["line"]
    if len(got["cpus"]) > 1:  # each worker thread sits on its own CPU
        singles = {v for v in got["tasks"].values() if v.isdigit()}
        assert {str(c) for c in got["cpus"][1:]} <= singles


def test_busy_machine_hint_only_when_auto_takes_every_cpu() -> None:
    from glowlm.runtime.binding import busy_note

    vm = plan(topo("kvm-epyc-2vcpu"))
    assert "other processes are busy" in (busy_note(1.9, 2, vm) or "")
    assert busy_note(0.3, 2, vm) is None
    assert busy_note(3.0, 2, plan(topo("kvm-epyc-2vcpu"), "0")) is None  # the user chose
    assert busy_note(3.0, 64, plan(topo("two-socket-skylake-smt"))) is None  # CPUs to spare
