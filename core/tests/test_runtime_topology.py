"""Topology from recorded sysfs trees: sockets, nodes, cores, SMT, cgroup limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from glowlm.runtime import topology
from glowlm.runtime.topology import format_cpulist, parse_cpulist

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"


def read(name: str, **kw: object) -> topology.Topology:
    return topology.read(SYSFS / name, **kw)  # type: ignore[arg-type]


# tree, sockets, nodes, cores, online CPUs, allowed CPUs, SMT
SHAPES = [
    ("kvm-epyc-2vcpu", 1, 1, 2, 2, 2, False),
    ("two-socket-skylake-smt", 2, 2, 32, 64, 64, True),
    ("container-cpuset", 2, 2, 32, 64, 16, True),
    ("laptop-alderlake-hybrid", 1, 1, 12, 16, 16, True),
    ("two-socket-snc2", 2, 4, 24, 48, 48, True),
]


@pytest.mark.parametrize("name,sockets,nodes,cores,online,allowed,smt", SHAPES)
def test_recorded_trees_read(name: str, sockets: int, nodes: int, cores: int, online: int,
                             allowed: int, smt: bool) -> None:
    t = read(name)
    assert (len(t.sockets), len(t.nodes), len(t.cores)) == (sockets, nodes, cores)
    assert (len(t.online), len(t.allowed), t.smt) == (online, allowed, smt)
    # every online CPU belongs to exactly one core and one node
    assert sorted(c for core in t.cores for c in core.cpus) == list(t.online)
    assert sorted(c for n in t.nodes for c in n.cpus) == list(t.online)


def test_siblings_grouped_from_thread_siblings_list_on_old_kernels() -> None:
    t = read("two-socket-skylake-smt")  # no core_cpus_list in this tree
    core0 = t.cores[0]
    assert core0.cpus == (0, 32) and core0.package == 0 and core0.node == 0
    assert t.cores[16].cpus == (16, 48) and t.cores[16].package == 1


def test_hybrid_laptop_p_cores_have_siblings_e_cores_do_not() -> None:
    t = read("laptop-alderlake-hybrid")
    assert [c.cpus for c in t.cores[:4]] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(len(c.cpus) == 1 for c in t.cores[4:])


def test_container_cpuset_quota_and_memory_limit() -> None:
    t = read("container-cpuset")
    assert format_cpulist(t.allowed) == "2-9,20-23,34-37"
    assert t.cgroup.version == 2 and t.cgroup.cpu_quota == 6.0
    assert t.cgroup.memory_limit_bytes == 32 << 30
    assert t.cgroup.memory_used_bytes == 1 << 30  # inactive page cache is not counted
    cores = t.allowed_cores(0)
    assert [c.cpus for c in cores[:4]] == [(2, 34), (3, 35), (4, 36), (5, 37)]
    assert [c.cpus for c in cores[4:]] == [(6,), (7,), (8,), (9,)]  # siblings not allowed
    assert [c.cpus for c in t.allowed_cores(1)] == [(20,), (21,), (22,), (23,)]


def test_allowed_is_cut_to_online_and_cpuset() -> None:
    t = read("container-cpuset", allowed={0, 1, 2, 3, 100})
    assert t.allowed == (2, 3)


def test_snc_nodes_memory_and_distances() -> None:
    t = read("two-socket-snc2")
    assert [format_cpulist(n.cpus) for n in t.nodes] == [
        "0-5,24-29", "6-11,30-35", "12-17,36-41", "18-23,42-47"]
    assert t.nodes[0].distances == (10, 11, 20, 20)
    assert t.nodes[0].total_bytes == 48 << 30
    assert 0 < t.nodes[0].available_bytes < t.nodes[0].total_bytes


def test_cgroup_v1_limits(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-3\n")
    for ctl, files in {"cpuset": {"cpuset.effective_cpus": "1-2"},
                       "cpu": {"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"},
                       "memory": {"memory.limit_in_bytes": str(8 << 30),
                                  "memory.usage_in_bytes": str(3 << 30),
                                  "memory.stat": f"total_inactive_file {1 << 30}\n"}}.items():
        d = root / "fs/cgroup" / ctl / "docker/abc"
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
    cgroup = "5:cpuset:/docker/abc\n4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n"
    t = topology.read(root, proc_self_cgroup=cgroup)
    assert t.allowed == (1, 2)
    assert (t.cgroup.version, t.cgroup.cpu_quota) == (1, 1.5)
    assert (t.cgroup.memory_limit_bytes, t.cgroup.memory_used_bytes) == (8 << 30, 2 << 30)
    assert len(t.nodes) == 1 and t.nodes[0].cpus == (0, 1, 2, 3)  # no node dirs: one node


def test_live_machine_matches_affinity() -> None:
    t = topology.read()
    assert set(t.allowed) <= set(os.sched_getaffinity(0))
    assert t.cores and t.nodes and t.source == "live"


def test_record_round_trips(tmp_path: Path) -> None:
    topology.record(tmp_path / "rec")
    recorded = topology.read(tmp_path / "rec")
    live = topology.read()
    assert (recorded.online, [c.cpus for c in recorded.cores]) == (
        live.online, [c.cpus for c in live.cores])


@pytest.mark.parametrize("text,cpus", [("0-3,8", (0, 1, 2, 3, 8)), ("5", (5,)), ("", ()),
                                       ("2,1,1", (1, 2))])
def test_cpulist_parse_and_format(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus
    if cpus:
        assert parse_cpulist(format_cpulist(cpus)) == cpus


@pytest.mark.parametrize("bad", ["a-b", "3-1", "-1"])
def test_cpulist_rejects_junk(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)
