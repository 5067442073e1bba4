"""The CPU topology this process runs on, read from sysfs and the process's cgroup.

Why sysfs and not ``lscpu``: its text changes between util-linux versions and
locales, it is missing from slim containers, and it cannot be pointed at a
recorded tree. :func:`read` takes ``sys_root`` so tests (and bug reports, via
:func:`record`) use recorded trees of machines we do not have.

A physical core is a group of CPUs that share ``core_cpus_list`` (older
kernels: ``thread_siblings_list``); grouping by that list, not by ``core_id``,
stays right on multi-die packages and hybrid CPUs where ``core_id`` repeats.
The CPUs this process may use are ``os.sched_getaffinity`` intersected with the
cgroup's cpuset; a cgroup CPU quota (``docker --cpus``) is kept as a number,
because it limits how many threads can run without limiting which CPUs.

Hosts without sysfs or ``sched_getaffinity`` (macOS) get a degraded but usable
topology: ``os.cpu_count()`` CPUs, each its own core, one node, no cgroup, every CPU
allowed (:func:`has_affinity` says whether binding can be applied at all).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

_UNLIMITED = 1 << 62  # cgroup v1 writes ~2^63 for "no limit"


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``'0-3,8,10-11'`` -> ``(0, 1, 2, 3, 8, 10, 11)``; raises ValueError on junk."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``'0-2,5'`` (the kernel's own notation)."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and runs[-1][-1] == cpu - 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


@dataclass(frozen=True)
class Core:
    """One physical core: its package (socket), NUMA node and SMT sibling CPUs."""

    package: int
    node: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class Node:
    """A NUMA node. ``available_bytes`` is free plus reclaimable page cache and slab."""

    id: int
    cpus: tuple[int, ...]
    total_bytes: int
    available_bytes: int
    distances: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cgroup:
    """Limits of the process's cgroup; ``None`` means "no limit found"."""

    version: int | None = None
    cpuset: tuple[int, ...] | None = None
    cpu_quota: float | None = None          # CPUs' worth of time, e.g. 6.0 for --cpus=6
    memory_limit_bytes: int | None = None
    memory_used_bytes: int | None = None    # excluding inactive page cache


@dataclass(frozen=True)
class Topology:
    online: tuple[int, ...]
    allowed: tuple[int, ...]
    cores: tuple[Core, ...]
    nodes: tuple[Node, ...]
    cgroup: Cgroup
    source: str

    @property
    def sockets(self) -> tuple[int, ...]:
        return tuple(sorted({c.package for c in self.cores}))

    @property
    def smt(self) -> bool:
        return any(len(c.cpus) > 1 for c in self.cores)

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def allowed_cores(self, node: int | None = None) -> list[Core]:
        """Cores with at least one allowed CPU, their CPUs cut to the allowed ones."""
        allowed = set(self.allowed)
        out = []
        for core in self.cores:
            cpus = tuple(c for c in core.cpus if c in allowed)
            if cpus and (node is None or core.node == node):
                out.append(Core(core.package, core.node, cpus))
        return out

    def describe(self) -> str:
        cores = self.allowed_cores()
        return (f"{len(self.sockets)} socket(s), {len(self.nodes)} NUMA node(s), "
                f"{len(self.cores)} cores / {len(self.online)} CPUs online"
                f"{' (SMT)' if self.smt else ''}; this process may use "
                f"{len(self.allowed)} CPUs ({format_cpulist(self.allowed)}) on "
                f"{len(cores)} cores")


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path, default: int = 0) -> int:
    raw = _text(path)
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default


def _meminfo_kb(text: str, key: str) -> int:
    m = re.search(rf"{re.escape(key)}:\s+(\d+)\s*kB", text)
    return int(m.group(1)) * 1024 if m else 0


def _read_nodes(sys_root: Path, online: tuple[int, ...]) -> tuple[Node, ...]:
    base = sys_root / "devices/system/node"
    nodes = []
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        meminfo = _text(d / "meminfo") or ""
        total = _meminfo_kb(meminfo, "MemTotal")
        avail = (_meminfo_kb(meminfo, "MemFree") + _meminfo_kb(meminfo, "Active(file)")
                 + _meminfo_kb(meminfo, "Inactive(file)") + _meminfo_kb(meminfo, "SReclaimable"))
        distances = tuple(int(x) for x in (_text(d / "distance") or "").split())
        cpus = parse_cpulist(_text(d / "cpulist") or "")
        nodes.append(Node(int(d.name[4:]), cpus, total, min(avail, total) if total else avail,
                          distances))
    if not nodes:  # kernel without CONFIG_NUMA: one node holding every CPU, memory unknown
        nodes.append(Node(0, online, 0, 0, (10,)))
    return tuple(nodes)


def _read_cores(sys_root: Path, online: tuple[int, ...], nodes: tuple[Node, ...]
                ) -> tuple[Core, ...]:
    node_of = {cpu: n.id for n in nodes for cpu in n.cpus}
    online_set = set(online)
    groups: dict[tuple[int, ...], int] = {}
    for cpu in online:
        topo = sys_root / f"devices/system/cpu/cpu{cpu}/topology"
        siblings = _text(topo / "core_cpus_list") or _text(topo / "thread_siblings_list")
        group = tuple(c for c in parse_cpulist(siblings) if c in online_set) if siblings \
            else (cpu,)
        groups.setdefault(group or (cpu,), _int(topo / "physical_package_id"))
    cores = [Core(pkg, node_of.get(cpus[0], 0), cpus) for cpus, pkg in groups.items()]
    return tuple(sorted(cores, key=lambda c: c.cpus[0]))


def _cgroup_paths(proc_self_cgroup: str | None) -> dict[str, str]:
    """Controller -> path from ``/proc/self/cgroup`` (``''`` is the v2 unified path)."""
    paths: dict[str, str] = {}
    for line in (proc_self_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _cgroup_dir(mount: Path, rel: str) -> Path:
    """The process's cgroup directory, or the mount root inside a cgroup namespace."""
    candidate = mount / rel.lstrip("/")
    return candidate if rel and candidate.is_dir() else mount


def _stat_value(text: str | None, key: str) -> int:
    m = re.search(rf"^{key} (\d+)$", text or "", re.MULTILINE)
    return int(m.group(1)) if m else 0


def read_cgroup(sys_root: Path, proc_self_cgroup: str | None) -> Cgroup:
    """cgroup v2 (``cpuset.cpus.effective``, ``cpu.max``, ``memory.max``) or v1 limits."""
    fs = sys_root / "fs/cgroup"
    paths = _cgroup_paths(proc_self_cgroup)
    if (fs / "cgroup.controllers").exists():
        d = _cgroup_dir(fs, paths.get("", "/"))
        cpuset_raw = _text(d / "cpuset.cpus.effective") or _text(d / "cpuset.cpus")
        quota = None
        cpu_max = (_text(d / "cpu.max") or "max").split()
        if cpu_max[0] != "max" and len(cpu_max) == 2:
            quota = int(cpu_max[0]) / int(cpu_max[1])
        limit, used = None, None
        walk = d
        while True:  # the tightest memory.max on the way up to the mount
            raw = _text(walk / "memory.max")
            if raw and raw != "max":
                limit = min(limit or _UNLIMITED, int(raw))
            if walk == fs or fs not in walk.parents:
                break
            walk = walk.parent
        if limit is not None:
            current = _int(d / "memory.current")
            used = current - _stat_value(_text(d / "memory.stat"), "inactive_file")
        return Cgroup(2, parse_cpulist(cpuset_raw) if cpuset_raw else None, quota, limit, used)
    if not (fs / "cpuset").is_dir() and not (fs / "memory").is_dir():
        return Cgroup()
    cs = _cgroup_dir(fs / "cpuset", paths.get("cpuset", "/"))
    cpuset_raw = _text(cs / "cpuset.effective_cpus") or _text(cs / "cpuset.cpus")
    cpu = _cgroup_dir(fs / "cpu", paths.get("cpu", "/"))
    quota_us, period_us = _int(cpu / "cpu.cfs_quota_us", -1), _int(cpu / "cpu.cfs_period_us", 0)
    quota = quota_us / period_us if quota_us > 0 and period_us > 0 else None
    mem = _cgroup_dir(fs / "memory", paths.get("memory", "/"))
    raw_limit = _int(mem / "memory.limit_in_bytes", _UNLIMITED)
    limit = raw_limit if raw_limit < _UNLIMITED else None
    used = None
    if limit is not None:
        used = _int(mem / "memory.usage_in_bytes") - _stat_value(
            _text(mem / "memory.stat"), "total_inactive_file")
    return Cgroup(1, parse_cpulist(cpuset_raw) if cpuset_raw else None, quota, limit, used)


def has_affinity() -> bool:
    """Whether this OS lets a process read and set its CPU affinity (Linux; not macOS)."""
    return hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")


def usable_cpu_count() -> int:
    """How many CPUs this process may run on: its affinity mask where the OS has one
    (Linux), else ``os.cpu_count()`` (macOS has no affinity API: the scheduler places
    threads, and :mod:`glowlm.runtime.binding` sets thread counts only)."""
    if has_affinity():
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _sysfs_present(root: Path) -> bool:
    return (root / "devices/system/cpu").is_dir()


def _without_sysfs() -> Topology:
    """The live topology of a host with no ``/sys`` (macOS): CPUs known by count only.

    Physical cores and SMT siblings cannot be told apart without sysfs, so every
    logical CPU is its own core; the binding plan is then only a thread count.
    """
    cpus = tuple(range(os.cpu_count() or 1))
    allowed = tuple(sorted(os.sched_getaffinity(0))) if has_affinity() else cpus
    return Topology(cpus, allowed, tuple(Core(0, 0, (c,)) for c in cpus),
                    (Node(0, cpus, 0, 0, (10,)),), Cgroup(), "os.cpu_count (no sysfs)")


def read(sys_root: str | os.PathLike[str] = "/sys", allowed: set[int] | None = None,
         proc_self_cgroup: str | None = None) -> Topology:
    """The topology under ``sys_root``, and the CPUs this process may use there.

    ``allowed`` defaults to ``os.sched_getaffinity(0)`` for the live ``/sys`` and to
    every online CPU for a recorded tree; either way it is cut to the cgroup's
    cpuset. ``proc_self_cgroup`` is the text of ``/proc/self/cgroup`` (read live
    for ``/sys``; a recorded tree holds its cgroup files at the mount root).
    """
    root = Path(sys_root)
    live = root == Path("/sys")
    if live and not _sysfs_present(root):
        return _without_sysfs()
    online_raw = _text(root / "devices/system/cpu/online")
    if online_raw:
        online = parse_cpulist(online_raw)
    else:  # very old or odd kernels: count the cpuN directories
        online = tuple(sorted(int(p.name[3:]) for p in (root / "devices/system/cpu").glob(
            "cpu[0-9]*")))
    nodes = _read_nodes(root, online)
    cores = _read_cores(root, online, nodes)
    if live and proc_self_cgroup is None:
        proc_self_cgroup = _text(Path("/proc/self/cgroup"))
    cgroup = read_cgroup(root, proc_self_cgroup)
    if allowed is None:
        allowed = set(os.sched_getaffinity(0)) if live and has_affinity() else set(online)
    usable = set(allowed) & set(online)
    if cgroup.cpuset is not None:
        usable &= set(cgroup.cpuset)
    return Topology(online, tuple(sorted(usable)), cores, nodes, cgroup,
                    "live" if live else str(root))


# What record() copies: enough for read() and for reading a bug report by eye.
_CPU_FILES = ("core_cpus_list", "thread_siblings_list", "physical_package_id", "core_id",
              "die_id")
_NODE_FILES = ("cpulist", "meminfo", "distance")
_CGROUP_FILES = ("cgroup.controllers", "cpuset.cpus.effective", "cpuset.cpus", "cpu.max",
                 "memory.max", "memory.current", "memory.stat")


def record(dest: str | os.PathLike[str], sys_root: str | os.PathLike[str] = "/sys") -> Path:
    """Copy the sysfs files :func:`read` uses into ``dest`` (a tree ``read`` accepts).

    For bug reports about binding on machines we do not have, and for test fixtures.
    Only cgroup v2 files at the process's cgroup are kept, written at the mount root.
    """
    src, out = Path(sys_root), Path(dest)
    (out / "devices/system/cpu").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "devices/system/cpu/online", out / "devices/system/cpu/online")
    for cpu in parse_cpulist((src / "devices/system/cpu/online").read_text()):
        for name in _CPU_FILES:
            f = src / f"devices/system/cpu/cpu{cpu}/topology/{name}"
            if f.exists():
                (out / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, out / f.relative_to(src))
    for d in (src / "devices/system/node").glob("node[0-9]*"):
        (out / d.relative_to(src)).mkdir(parents=True, exist_ok=True)
        for name in _NODE_FILES:
            if (d / name).exists():
                shutil.copyfile(d / name, out / d.relative_to(src) / name)
    fs = src / "fs/cgroup"
    if (fs / "cgroup.controllers").exists():
        rel = _cgroup_paths(_text(Path("/proc/self/cgroup"))).get("", "/")
        cg = _cgroup_dir(fs, rel)
        (out / "fs/cgroup").mkdir(parents=True, exist_ok=True)
        for name in _CGROUP_FILES:
            f = cg / name if name != "cgroup.controllers" else fs / name
            if f.exists():
                shutil.copyfile(f, out / "fs/cgroup" / name)
    return out
