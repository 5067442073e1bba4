"""``glowlm collect-env``: the facts a bug report about performance needs.

The report is a list of sections. Each section is a function taking the shared
:class:`EnvContext` (facts computed once: the host, the platform selection) and
returning ``(title, {key: value})``; :data:`SECTIONS` is the order they print in:
the machine's (:mod:`.host`: versions, torch, CPU, NUMA, platform), then the
runtime's (:mod:`.runtime`: topology, binding, allocator, KV budget, linear choice,
settings). To add a section, write one such function in the module it belongs to
and append it to that module's list. A section that raises is reported as its
error, so one broken probe never hides the rest. This module is the verb: the
report's assembly, its text and JSON forms, and the parser.
"""

from __future__ import annotations

import argparse
import json

from glowlm.entrypoints.cli.collect_env.host import (
    FLAGS_THAT_MATTER,
    HOST_SECTIONS,
    EnvContext,
    Section,
    cpu_section,
    numa_section,
    platform_section,
    torch_section,
    versions_section,
)
from glowlm.entrypoints.cli.collect_env.runtime import (
    RUNTIME_SECTIONS,
    allocator_section,
    binding_section,
    kv_budget_section,
    linear_choice_section,
    numa_binding_section,
    settings_section,
    topology_section,
)

#: Every section, in the order the report prints them.
SECTIONS: list[Section] = [*HOST_SECTIONS, *RUNTIME_SECTIONS]

__all__ = ["FLAGS_THAT_MATTER", "SECTIONS", "EnvContext", "Section", "allocator_section",
           "binding_section", "collect", "cpu_section", "kv_budget_section",
           "linear_choice_section", "numa_binding_section", "numa_section",
           "platform_section", "register", "render_text", "run", "settings_section",
           "topology_section", "torch_section", "versions_section"]


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
