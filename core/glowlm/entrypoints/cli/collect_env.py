"""``glowlm collect-env``: the facts a bug report about performance needs.

The report is a list of sections. Each section is a function taking the shared
:class:`EnvContext` (facts computed once: the host, the platform selection) and
returning ``(title, {key: value})``; :data:`SECTIONS` is the order they print in.
To add a section (thread binding, allocator, KV budget...), write one such
function and append it to :data:`SECTIONS`. A section that raises is reported as
its error, so one broken probe never hides the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as _platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from glowlm import __version__, envs
from glowlm.errors import PlatformError
from glowlm.platforms import host as host_mod
from glowlm.platforms.host import HostInfo
from glowlm.platforms.selection import Candidate, Selection, choose, gather_candidates
from glowlm.plugins.manager import load_plugins

#: The CPU flags that change what glowlm can do; shown as present or absent.
FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile",
                     "asimd", "bf16", "sve", "i8mm", "vxe", "vxe2")


@dataclass
class EnvContext:
    """Facts shared by sections, each computed on first use."""

    host: HostInfo = field(default_factory=host_mod.live)

    @cached_property
    def selection(self) -> tuple[list[Candidate], Selection | None, str | None]:
        env = envs.get()
        candidates = gather_candidates(load_plugins(env.plugins_block), self.host)
        try:
            return candidates, choose(candidates, self.host, env.platform), None
        except PlatformError as exc:
            return candidates, None, str(exc)


Section = Callable[[EnvContext], tuple[str, dict[str, object]]]


def versions_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    from importlib import metadata

    out: dict[str, object] = {"glowlm": __version__, "python": _platform.python_version(),
                              "os": _platform.platform()}
    for name in ("torch", "transformers", "zentorch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return "versions", out


def _config_line(config: str, pattern: str) -> str:
    m = re.search(rf"^\s*-?\s*((?:{pattern}).*)$", config, re.MULTILINE)
    return m.group(1).strip() if m else "not built in"


def torch_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """torch's build: the BLAS/oneDNN/OpenMP it links and the SIMD level it dispatches to."""
    import torch

    config = torch.__config__.show()
    parallel = torch.__config__.parallel_info()
    backend = re.search(r"ATen parallel backend: (\S+)", parallel)
    return "torch", {
        "version": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "openmp": _config_line(config, r"OpenMP"),
        "mkl": _config_line(config, r"Intel\(R\) (oneAPI )?Math Kernel"),
        "onednn": _config_line(config, r"Intel\(R\) MKL-DNN|oneDNN"),
        "parallel_backend": backend.group(1) if backend else "unknown",
        "intra_op_threads": torch.get_num_threads(),
        "inter_op_threads": torch.get_num_interop_threads(),
    }


def cpu_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    h = ctx.host
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return "cpu", {
        "model": h.model_name or "unknown", "vendor": h.vendor or "unknown",
        "machine": h.machine, "system": h.system,
        "logical_cpus": h.logical_cpus, "physical_cores": h.physical_cores,
        "cpus_usable_by_this_process": usable,
        "flags_present": " ".join(f for f in FLAGS_THAT_MATTER if h.has_flag(f)) or "none",
        "flags_absent": " ".join(f for f in FLAGS_THAT_MATTER if not h.has_flag(f)) or "none",
    }


def numa_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    nodes = ctx.host.numa_nodes
    out: dict[str, object] = {"nodes": len(nodes)}
    for n in nodes:
        out[f"node{n.id}"] = f"cpus {_cpulist(n.cpus)}, {n.memory_bytes / 2**30:.1f} GiB"
    return "numa", out


def platform_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    candidates, selection, error = ctx.selection
    out: dict[str, object] = {}
    if selection is None:
        out["selected"] = "none"
        out["error"] = error
    else:
        p = selection.platform
        out.update({"selected": p.name, "isa": p.capabilities.isa, "why": selection.reason,
                    "notes": p.startup_notes()})
    out["candidates"] = [f"{c.name} ({c.distribution} {c.version}, rank {c.rank}): "
                         f"{'match' if c.matched else 'miss'}: {c.reason}" for c in candidates]
    return "platform", out


def _cpulist(cpus: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``'0-2,5'``."""
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and runs[-1][-1] == cpu - 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


SECTIONS: list[Section] = [versions_section, torch_section, cpu_section, numa_section,
                           platform_section]


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


SECTIONS += [topology_section, binding_section, numa_binding_section, allocator_section,
             kv_budget_section]

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


SECTIONS.append(linear_choice_section)


def settings_section(ctx: EnvContext) -> tuple[str, dict[str, object]]:
    """Every GLOWLM_* variable core and the installed plugins declare, with its value here."""
    out: dict[str, object] = {}
    for owner, setting in load_plugins(envs.get().plugins_block).settings():
        value = os.environ.get(setting.name)
        shown = f"{value!r}" if value is not None else f"unset (default {setting.default!r})"
        out[setting.name] = f"{shown} [{owner}]"
    return "settings", out


SECTIONS.append(settings_section)


def collect(ctx: EnvContext | None = None) -> list[tuple[str, dict[str, object]]]:
    """Run every section; a failing one reports its error instead of stopping the report."""
    ctx = ctx or EnvContext()
    report: list[tuple[str, dict[str, object]]] = []
    for section in SECTIONS:
        try:
            report.append(section(ctx))
        except Exception as exc:  # noqa: BLE001 - shown in the report, never swallowed
            name = section.__name__.removesuffix("_section")
            report.append((name, {"error": f"{type(exc).__name__}: {exc}"}))
    return report


def render_text(report: list[tuple[str, dict[str, object]]]) -> str:
    lines: list[str] = []
    for title, values in report:
        lines.append(f"== {title} ==")
        for key, value in values.items():
            if isinstance(value, list):
                lines.append(f"{key}:")
                lines += [f"  {item}" for item in value] or ["  (none)"]
            else:
                lines.append(f"{key}: {value}")
        lines.append("")
    return "\n".join(lines).rstrip()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collect-env", help="print the environment report to attach to bug reports",
        description="Print torch's build, the CPU and its flags, NUMA layout and the "
                    "platform glowlm selects (and why).")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        print(json.dumps(dict(report), indent=2, default=str))
    else:
        print(render_text(report))
    return 0
