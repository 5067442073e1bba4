"""Thread binding: which CPUs each rank's OpenMP threads run on, planned then applied.

:func:`plan` is pure (topology + settings -> :class:`BindingPlan`) so every rule is
unit-tested on recorded machines; :func:`apply_for_process` reads the live topology
and ``GLOWLM_CPU_*`` settings, applies the plan once per process and returns it.

Rules for ``GLOWLM_CPU_OMP_THREADS_BIND=auto``: one thread per physical core (the
SMT sibling would share the core's vector units, which matmuls already saturate);
each rank's threads inside one NUMA node (ranks are spread over nodes, and share a
node only when there are more ranks than nodes); reserved cores are taken from the
end of the last rank's list and left for the front-end; a cgroup CPU quota caps the
thread count, since threads beyond it only wait for their time slice.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace

from glowlm.errors import ConfigError
from glowlm.runtime.topology import Core, Topology, format_cpulist, parse_cpulist


@dataclass(frozen=True)
class RankBinding:
    """One rank: its OpenMP threads' CPUs in thread order, and its memory node."""

    rank: int
    cpus: tuple[int, ...]
    node: int | None  # NUMA node to bind memory to; None: leave memory policy alone


@dataclass(frozen=True)
class BindingPlan:
    mode: str  # "auto" | "list" | "nobind"
    rank: int
    ranks: tuple[RankBinding, ...]
    reserved_cpus: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    # Filled in by apply(): what actually happened in this process.
    applied: tuple[str, ...] = field(default=(), compare=False)

    @property
    def this(self) -> RankBinding:
        return self.ranks[self.rank]

    @property
    def num_threads(self) -> int | None:
        """OpenMP threads for this rank; None with ``nobind`` (torch's default stays)."""
        return len(self.this.cpus) or None

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.mode == "nobind":
            return "thread binding off (GLOWLM_CPU_OMP_THREADS_BIND=nobind)"
        r = self.this
        node = f", memory on NUMA node {r.node}" if r.node is not None else ""
        reserved = (f"; CPUs {format_cpulist(self.reserved_cpus)} left for the front-end"
                    if self.reserved_cpus else "")
        applied = f" [{'; '.join(self.applied)}]" if self.applied else ""
        return (f"thread binding {self.mode}: rank {r.rank} of {len(self.ranks)}: "
                f"{len(r.cpus)} OpenMP threads on CPUs {format_cpulist(r.cpus)}{node}"
                f"{reserved}{applied}")


def parse_lists(raw: str) -> tuple[tuple[int, ...], ...]:
    """``'0-31|32-63'`` -> one CPU tuple per rank; ConfigError naming the bad part."""
    lists = []
    for part in raw.split("|"):
        try:
            cpus = parse_cpulist(part)
        except ValueError:
            cpus = ()
        if not cpus:
            raise ConfigError(f"GLOWLM_CPU_OMP_THREADS_BIND={raw!r}: {part.strip()!r} is not a "
                              "CPU list; use 'auto', 'nobind', or lists like 0-31|32-63")
        lists.append(cpus)
    return tuple(lists)


def default_reserved(allowed: int, num_ranks: int, serving: bool) -> int:
    """One core for the HTTP front-end when one rank serves on more than two CPUs."""
    return 1 if serving and num_ranks == 1 and allowed > 2 else 0


def _split(cores: list[Core], parts: int) -> list[list[Core]]:
    """Contiguous, near-equal chunks (earlier chunks get the remainder)."""
    size, extra = divmod(len(cores), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(cores[start:end])
        start = end
    return out


def _auto(topo: Topology, num_ranks: int, reserved: int) -> tuple[list[list[Core]],
                                                                 list[int], list[str]]:
    notes: list[str] = []
    nodes = [n.id for n in topo.nodes if topo.allowed_cores(n.id)]
    if not nodes:
        raise ConfigError("this process may use no online CPU (check its affinity and cgroup "
                          "cpuset)")
    rank_node = [nodes[i * len(nodes) // num_ranks] for i in range(num_ranks)]
    if num_ranks < len(nodes):
        notes.append(f"{len(nodes)} NUMA nodes but {num_ranks} rank(s): nodes "
                     f"{','.join(map(str, sorted(set(nodes) - set(rank_node))))} stay idle; "
                     f"one rank per node: --tensor-parallel-size {len(nodes)}")
    per_rank: list[list[Core]] = []
    for node in dict.fromkeys(rank_node):
        sharing = rank_node.count(node)
        cores = topo.allowed_cores(node)
        if len(cores) < sharing:
            raise ConfigError(f"{sharing} ranks share NUMA node {node}, which has only "
                              f"{len(cores)} usable core(s); use fewer ranks")
        per_rank.extend(_split(cores, sharing))
    if reserved:
        last = per_rank[-1]
        if reserved >= len(last):
            raise ConfigError(f"GLOWLM_CPU_NUM_OF_RESERVED_CPU={reserved} leaves rank "
                              f"{num_ranks - 1} no core (it has {len(last)}); lower it")
        per_rank[-1] = last[:-reserved]
        reserved_cpus = [c for core in last[-reserved:] for c in core.cpus]
    else:
        reserved_cpus = []
    quota = topo.cgroup.cpu_quota
    if quota is not None:
        cap = max(1, math.floor(quota / num_ranks))
        if any(len(cores) > cap for cores in per_rank):
            notes.append(f"cgroup CPU quota {quota:g} CPUs: {cap} thread(s) per rank")
            per_rank = [cores[:cap] for cores in per_rank]
    if topo.smt:
        notes.append("one thread per physical core; SMT siblings left idle")
    return per_rank, reserved_cpus, notes


def _explicit(topo: Topology, lists: tuple[tuple[int, ...], ...], raw: str, num_ranks: int
              ) -> tuple[list[RankBinding], list[str]]:
    if len(lists) != num_ranks:
        raise ConfigError(f"GLOWLM_CPU_OMP_THREADS_BIND={raw!r} has {len(lists)} CPU list(s) "
                          f"but there are {num_ranks} rank(s); give one list per rank, "
                          "separated by '|'")
    allowed = set(topo.allowed)
    seen: dict[int, int] = {}
    ranks, notes = [], []
    for rank, cpus in enumerate(lists):
        bad = [c for c in cpus if c not in allowed]
        if bad:
            limit = " (cgroup cpuset)" if topo.cgroup.cpuset is not None else ""
            raise ConfigError(
                f"GLOWLM_CPU_OMP_THREADS_BIND: rank {rank}'s list {format_cpulist(cpus)} "
                f"has CPU(s) {format_cpulist(bad)} this process may not use; allowed CPUs"
                f"{limit}: {format_cpulist(topo.allowed)}")
        clash = sorted(c for c in cpus if c in seen)
        if clash:
            raise ConfigError(f"GLOWLM_CPU_OMP_THREADS_BIND: CPU(s) {format_cpulist(clash)} "
                              f"appear in the lists of ranks {seen[clash[0]]} and {rank}; "
                              "ranks must not share CPUs")
        seen.update(dict.fromkeys(cpus, rank))
        node_ids = sorted({n.id for n in topo.nodes for c in cpus if c in n.cpus})
        node = node_ids[0] if len(node_ids) == 1 and len(topo.nodes) > 1 else None
        if len(node_ids) > 1:
            notes.append(f"rank {rank}'s CPUs span NUMA nodes {node_ids}: memory not bound")
        ranks.append(RankBinding(rank, cpus, node))
    return ranks, notes


def plan(topo: Topology, bind: str = "auto", reserved: int | None = None, *,
         num_ranks: int = 1, rank: int = 0, serving: bool = False) -> BindingPlan:
    """The binding for every rank (``rank`` selects which one this process is).

    ``bind`` is ``GLOWLM_CPU_OMP_THREADS_BIND``; ``reserved`` is
    ``GLOWLM_CPU_NUM_OF_RESERVED_CPU`` in whole cores (None: the default of
    :func:`default_reserved`). Raises ConfigError for any setting that cannot be
    honoured here, naming the setting and what this process may use.
    """
    if not 0 <= rank < num_ranks:
        raise ConfigError(f"rank {rank} is outside 0..{num_ranks - 1}")
    mode = bind.strip().lower()
    if mode == "nobind":
        return BindingPlan("nobind", rank, tuple(RankBinding(r, (), None)
                                                 for r in range(num_ranks)))
    if mode != "auto":
        ranks, notes = _explicit(topo, parse_lists(bind), bind, num_ranks)
        if reserved:
            notes.append("GLOWLM_CPU_NUM_OF_RESERVED_CPU is ignored with explicit CPU lists")
        return BindingPlan("list", rank, tuple(ranks), (), tuple(notes))
    if reserved is None:
        reserved = default_reserved(len(topo.allowed), num_ranks, serving)
    per_rank, reserved_cpus, notes = _auto(topo, num_ranks, reserved)
    numa = len(topo.nodes) > 1
    ranks = tuple(RankBinding(r, tuple(core.cpus[0] for core in cores),
                              cores[0].node if numa else None)
                  for r, cores in enumerate(per_rank))
    return BindingPlan("auto", rank, ranks, tuple(sorted(reserved_cpus)), tuple(notes))


_APPLIED: BindingPlan | None = None


def applied_plan() -> BindingPlan | None:
    """The plan :func:`apply_for_process` applied in this process, if it ran."""
    return _APPLIED


def apply_for_process(num_ranks: int = 1, rank: int = 0, serving: bool = False,
                      rebind: bool = False) -> BindingPlan:
    """Plan from the live topology and ``GLOWLM_CPU_*`` settings, apply once, return it.

    Call it in the thread that will run the model, before the first forward pass:
    OpenMP thread pools belong to the thread that starts parallel regions. Called
    again in the same process, it returns the plan already applied (binding twice
    would fight over the same threads). ``rebind``: a TP/PP driver that was bound as
    the only rank (the server binds its engine thread first) takes its rank's share.
    """
    global _APPLIED
    if _APPLIED is not None and not (rebind and (len(_APPLIED.ranks), _APPLIED.rank)
                                     != (num_ranks, rank)):
        return _APPLIED
    from glowlm import envs
    from glowlm.runtime import pinning, topology

    env = envs.get()
    topo = topology.read()
    p = plan(topo, env.omp_threads_bind, env.num_reserved_cpus,
             num_ranks=num_ranks, rank=rank, serving=serving)
    if p.this.cpus and not topology.has_affinity():
        notes = [_threads_only(len(p.this.cpus))]
    else:
        notes = pinning.apply(p.this.cpus, p.this.node)
    busy = busy_note(os.getloadavg()[0], len(topo.allowed), p)
    _APPLIED = replace(p, applied=tuple(notes + ([busy] if busy else [])))
    return _APPLIED


def _threads_only(threads: int) -> str:
    """macOS and other hosts without ``sched_setaffinity``: set the thread count only.

    The OS schedules the threads itself (macOS offers only affinity *hints* between
    threads, not CPU sets), and there is no NUMA policy to apply.
    """
    import torch

    torch.set_num_threads(threads)
    return (f"{threads} OpenMP threads, not pinned: this OS has no sched_setaffinity "
            "(macOS); memory policy left alone")


def busy_note(load: float, allowed: int, p: BindingPlan) -> str | None:
    """A hint when other processes already keep CPUs busy and auto took them all.

    The plan comes from the topology, not the load: on a shared machine a team of
    OpenMP threads runs at the pace of its most contended core (measured 4-5x slower
    on a 2-CPU VM with one core taken; docs/runtime.md).
    """
    if p.mode != "auto" or load < 1.0 or (p.num_threads or 0) + len(p.reserved_cpus) < allowed:
        return None
    return (f"load average {load:.1f} on {allowed} CPUs before start: other processes are "
            "busy; if that lasts, list idle CPUs in GLOWLM_CPU_OMP_THREADS_BIND")
