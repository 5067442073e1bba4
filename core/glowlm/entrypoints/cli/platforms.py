"""``glowlm platforms``: which platform runs here (or on a recorded host), and why.

Lists every candidate the installed plugins offer, one line each with its
distribution, rank and the reason it matched or missed, then the selection and
the start-up notes it would log. ``--cpuinfo``/``--sysctl`` describe a recorded
machine instead of this one, so "what would be chosen on that machine" needs no
access to it. Selection errors (a forced platform that cannot run, a tie) are
printed after the table, so the reasons stay visible.
"""

from __future__ import annotations

import argparse
import json

from glowlm import envs
from glowlm.errors import ConfigError, PlatformError
from glowlm.platforms import host as host_mod
from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import dtype_name
from glowlm.platforms.selection import Candidate, Selection, choose, gather_candidates
from glowlm.plugins.manager import load_plugins


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "platforms", help="list hardware platforms and which one is selected, with reasons",
        description="List every platform the installed plugins provide, whether each can "
                    "run on this host (or a recorded one) and why, and which one is selected.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--platform", metavar="NAME",
                   help="force a platform (overrides GLOWLM_PLATFORM)")
    p.add_argument("--cpuinfo", metavar="FILE", help="describe a recorded /proc/cpuinfo dump")
    p.add_argument("--sysctl", metavar="FILE", help="describe a recorded macOS `sysctl -a` dump")
    p.add_argument("--machine", metavar="ARCH",
                   help="uname -m of the recorded host (default: inferred from the dump)")
    p.add_argument("--system", metavar="OS", help="Linux or Darwin (default: from the dump)")
    p.add_argument("--assume-module", action="append", default=[], metavar="MODULE",
                   help="treat MODULE as importable on the recorded host (e.g. zentorch)")
    p.set_defaults(func=run)


def gguf_native_types() -> list[str]:
    """The GGUF block types a platform implementing ``gguf`` runs without dequantizing."""
    from glowlm.layers.quantization.gguf import NATIVE_TYPES

    return list(NATIVE_TYPES)


def host_from_args(args: argparse.Namespace) -> HostInfo:
    """The live host, or the recorded one the flags describe."""
    recorded = args.cpuinfo or args.sysctl or args.machine or args.system
    if not recorded:
        if args.assume_module:
            raise ConfigError("--assume-module describes a recorded host; use it with "
                              "--cpuinfo or --sysctl (this host's modules are probed)")
        return host_mod.live()
    if args.cpuinfo and args.sysctl:
        raise ConfigError("give either --cpuinfo (Linux) or --sysctl (macOS), not both")
    return host_mod.from_files(machine=args.machine, system=args.system, cpuinfo=args.cpuinfo,
                               sysctl=args.sysctl, modules=frozenset(args.assume_module))


def describe(host: HostInfo, forced: str | None, block: frozenset[str]
             ) -> tuple[list[Candidate], Selection | None, PlatformError | None]:
    """Candidates and the selection for ``host``; a selection error is returned, not raised."""
    candidates = gather_candidates(load_plugins(block), host)
    try:
        return candidates, choose(candidates, host, forced), None
    except PlatformError as exc:
        return candidates, None, exc


def host_line(host: HostInfo) -> str:
    vendor = "" if host.vendor and host.vendor in host.model_name else host.vendor
    cpu = " ".join(x for x in (vendor, host.model_name) if x) or "unknown CPU"
    return (f"{cpu}, {host.machine} {host.system}, {host.logical_cpus} logical CPUs / "
            f"{host.physical_cores} cores (from {host.source})")


def _candidate_line(c: Candidate, selected: str | None) -> str:
    mark = "*" if c.name == selected else " "
    dist = f"{c.distribution} {c.version}"
    rank = "-" if c.rank < 0 else str(c.rank)
    line = f"  {mark} {c.name:<10} {rank:>4}  {dist:<20} {'yes' if c.matched else 'no ':<4}"
    line += c.reason
    if c.capabilities is not None:
        caps = c.capabilities
        line += (f"  [isa {caps.isa}; dtypes {','.join(dtype_name(d) for d in caps.dtypes)}; "
                 f"quant {','.join(caps.quantization) or '-'}; "
                 f"kernels {','.join(caps.kernels) or 'reference'}]")
    return line


def render_text(host: HostInfo, candidates: list[Candidate], selection: Selection | None
                ) -> str:
    lines = [f"host: {host_line(host)}"]
    if selection is not None:
        p = selection.platform
        caps = p.capabilities
        lines.append(f"selected: {p.name} (isa {caps.isa}, {caps.status}): {selection.reason}")
        lines.append(f"  dtypes {', '.join(dtype_name(d) for d in caps.dtypes)} (first is the "
                     f"fallback); quantization {', '.join(caps.quantization) or 'none'}; "
                     f"kernels {', '.join(caps.kernels) or 'core reference'}")
        if "gguf" in caps.quantization:
            lines.append(f"  GGUF types run natively: {', '.join(gguf_native_types())} "
                         "(linear layers, and a 4-bit LM head; GLOWLM_GGUF_NATIVE=0 dequantizes)")
        lines += [f"  note: {n}" for n in p.startup_notes()]
    lines.append("candidates (highest rank first; * = selected):")
    lines.append(f"    {'name':<10} {'rank':>4}  {'distribution':<20} {'ok':<4}reason")
    chosen = selection.platform.name if selection else None
    lines += [_candidate_line(c, chosen) for c in candidates]
    return "\n".join(lines)


def to_json(host: HostInfo, candidates: list[Candidate], selection: Selection | None,
            error: PlatformError | None) -> dict[str, object]:
    out: dict[str, object]
    if selection is not None:
        out = selection.to_json()
        out["notes"] = selection.platform.startup_notes()
        out["gguf_native_types"] = (gguf_native_types() if "gguf" in
                                    selection.platform.capabilities.quantization else [])
    else:
        out = {"selected": None, "error": str(error),
               "candidates": [c.to_json() for c in candidates]}
    out["host"] = {"machine": host.machine, "system": host.system, "vendor": host.vendor,
                   "model_name": host.model_name, "source": host.source}
    return out


def plugin_settings(block: frozenset[str]) -> list[dict[str, str]]:
    """The environment variables the installed plugins declare (core's are in
    ``glowlm collect-env`` and docs/configuration.md), with their value here."""
    return [{"name": st.name, "plugin": owner, "default": st.default, "value": st.raw(),
             "help": st.help}
            for owner, st in load_plugins(block).settings() if owner != "glowlm"]


def render_settings(settings: list[dict[str, str]]) -> str:
    lines = ["plugin settings (environment variables; core's: glowlm collect-env):"]
    lines += [f"    {s['plugin']:<10} {s['name']}={s['value']} (default {s['default']!r}): "
              f"{s['help']}" for s in settings]
    return "\n".join(lines if settings else lines[:1] + ["    none"])


def run(args: argparse.Namespace) -> int:
    env = envs.get()
    host = host_from_args(args)
    candidates, selection, error = describe(host, args.platform or env.platform,
                                            env.plugins_block)
    settings = plugin_settings(env.plugins_block)
    if args.json:
        print(json.dumps({**to_json(host, candidates, selection, error),
                          "settings": settings}, indent=2))
    else:
        print(render_text(host, candidates, selection))
        print(render_settings(settings))
    if error is not None:
        raise error
    return 0
