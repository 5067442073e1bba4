"""collect-env's sections about what glowlm's runtime would do here: the topology it
reads, the thread and NUMA binding it plans, the allocator and OpenMP runtimes, the KV
cache budget, the measured linear choice cached for this CPU, and every GLOWLM_* setting.
"""

from __future__ import annotations

import os

from glowlm import envs
from glowlm.entrypoints.cli.collect_env.host import EnvContext, Section
from glowlm.plugins.manager import load_plugins


def topology_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """Sockets, nodes, cores and what this process may use (affinity + cgroup)."""
    from glowlm.runtime import topology

    topo = topology.read()
    cg = topo.cgroup
    return "topology", {
        "summary": topo.describe(),
        "sockets": len(topo.sockets), "physical_cores": len(topo.cores),
        "smt": topo.smt,
        "allowed_cpus": topology.format_cpulist(topo.allowed),
        "nodes": [f"node{n.id}: cpus {topology.format_cpulist(n.cpus)}, "
                  f"{n.total_bytes / 2**30:.1f} GiB total, {n.available_bytes / 2**30:.1f} GiB "
                  f"available, distances {' '.join(map(str, n.distances))}" for n in topo.nodes],
        "cgroup": (f"v{cg.version}: cpuset "
                   f"{topology.format_cpulist(cg.cpuset) if cg.cpuset else 'none'}, cpu quota "
                   f"{cg.cpu_quota if cg.cpu_quota is not None else 'none'}, memory limit "
                   + (f"{cg.memory_limit_bytes / 2**30:.1f} GiB" if cg.memory_limit_bytes
                      else "none")) if cg.version else "none found",
    }


def binding_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """The plan GLOWLM_CPU_OMP_THREADS_BIND gives one rank, offline and serving."""
    from glowlm.errors import ConfigError
    from glowlm.runtime import binding, topology

    env = envs.get()
    topo = topology.read()
    out: dict[str, object] = {
        "GLOWLM_CPU_OMP_THREADS_BIND": env.omp_threads_bind,
        "GLOWLM_CPU_NUM_OF_RESERVED_CPU": env.num_reserved_cpus
        if env.num_reserved_cpus is not None else "default"}
    for label, serving in (("offline", False), ("serve", True)):
        try:
            p = binding.plan(topo, env.omp_threads_bind, env.num_reserved_cpus,
                             serving=serving)
            out[label] = p.describe()
            if p.notes:
                out[f"{label}_notes"] = list(p.notes)
        except ConfigError as exc:
            out[label] = f"invalid: {exc}"
    applied = binding.applied_plan()
    out["applied_in_this_process"] = applied.describe() if applied else "no (collect-env)"
    return "thread binding", out


def numa_binding_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """Whether NUMA system calls are allowed here, and this process's memory policy."""
    from glowlm.runtime import numa, topology

    status = numa.current_policy()
    allowed = "EPERM" not in status.detail and "unknown" not in status.detail
    nodes = len(topology.read().nodes)
    return "numa binding", {
        "policy_of_this_process": status.detail,
        "numa_syscalls": "allowed" if allowed else "forbidden",
        "fix": "not needed" if allowed else numa.FIX,
        "binding_needed": "yes: memory of each rank goes to its node" if nodes > 1
        else "no: one NUMA node",
    }


def allocator_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """Allocator and OpenMP runtimes mapped now, what glowlm would preload, and why."""
    import torch  # noqa: F401 - so torch's OpenMP runtime shows as mapped

    from glowlm.runtime import preload

    loaded = preload.mapped()
    decision = preload.decide_live()
    omp = [n for n in ("libgomp", "libiomp5", "libomp") if n in loaded]
    out: dict[str, object] = {
        "allocator": next((f"{n} ({loaded[n]})" for n in ("tcmalloc", "jemalloc")
                           if n in loaded), "glibc malloc"),
        "openmp_mapped": [f"{n}: {loaded[n]}" for n in omp],
        "torch_openmp": " ".join(preload.torch_openmp()),
        "LD_PRELOAD": decision.ld_preload or "unset",
        "decision": list(decision.reasons),
        "exact_line": decision.advice() or "nothing to add",
    }
    if len(omp) > 1:
        out["warning"] = f"{len(omp)} OpenMP runtimes in one process: {', '.join(omp)}"
    return "allocator and openmp", out


def kv_budget_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """The KV cache setting and the memory rank 0 would plan against."""
    from glowlm.engine import memory

    env = envs.get()
    topo, node = memory.rank_node()
    avail, source = memory.available_memory(topo, node)
    kv = env.kvcache_space_gib
    return "kv budget", {
        "GLOWLM_CPU_KVCACHE_SPACE": "auto" if kv is None else f"{kv:g} GiB",
        "meaning": (f"{memory.AUTO_KV_SHARE:.0%} of the memory left after weights, "
                    "activations and headroom" if kv is None else "per rank, fixed"),
        "available_to_rank0": f"{avail / 2**30:.2f} GiB ({source})",
        "fits": "yes" if kv is None or kv * 2**30 + memory.HEADROOM_BYTES < avail
        else "no: lower GLOWLM_CPU_KVCACHE_SPACE (weights not counted here)",
    }


def linear_choice_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """The measured per-shape linear choice cached for this CPU (glowlm.layers.linear_choice):
    every thread count and kernel build measured here, each shape's winner per token
    class with every candidate's time."""
    from glowlm.layers import linear_choice

    env = envs.get()
    out: dict[str, object] = {
        "GLOWLM_LINEAR_IMPL": env.linear_impl or "unset (measure at load)",
        "cache": env.linear_choice_cache,
        "token_classes": [f"{c.name}: timed at {c.rows} rows, used up to "
                          f"{c.max_rows if c.max_rows is not None else 'any'}"
                          for c in linear_choice.TOKEN_CLASSES]}
    entries = linear_choice.cached_choices(env.linear_choice_cache, ctx.host)
    if not entries:
        out["cached"] = "nothing yet for this CPU (the first model load measures)"
    for n, entry in enumerate(entries):
        host = entry.get("host", {})
        versions = ", ".join(f"{k} {v}" for k, v in sorted(entry.get("candidates", {}).items()))
        lines = [f"file {entry['file']}", f"threads {host.get('threads')}; {versions}"]
        for shape, classes in sorted(entry.get("choices", {}).items()):
            per = "; ".join(
                f"{cls} {m['winner']} (" + ", ".join(
                    f"{name} {'skipped' if t is None else f'{t:.0f} us'}"
                    for name, t in sorted(m.get("us", {}).items())) + ")"
                for cls, m in classes.items())
            lines.append(f"{shape}: {per}")
        out[f"entry{n}"] = lines
    return "linear choice", out


def settings_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """Every GLOWLM_* variable core and the installed plugins declare, with its value here."""
    out: dict[str, object] = {}
    for owner, setting in load_plugins(envs.get().plugins_block).settings():
        value = os.environ.get(setting.name)
        shown = f"{value!r}" if value is not None else f"unset (default {setting.default!r})"
        out[setting.name] = f"{shown} [{owner}]"
    return "settings", out


#: The runtime's sections, in the order they print (after the machine's).
RUNTIME_SECTIONS: list[Section] = [topology_section, binding_section, numa_binding_section,
                                   allocator_section, kv_budget_section,
                                   linear_choice_section, settings_section]
