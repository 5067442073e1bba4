"""collect-env's sections about the machine and the install: versions, torch's build,
the CPU and its flags, the NUMA layout, and the platform glowlm selects (and why).

:class:`EnvContext` holds the facts every section shares (the host, the platform
selection), computed once; the runtime sections (:mod:`.runtime`) read it too.
"""

from __future__ import annotations

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


#: The machine's sections, in the order they print.
HOST_SECTIONS: list[Section] = [versions_section, torch_section, cpu_section, numa_section,
                                platform_section]
