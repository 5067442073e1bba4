"""What a platform detector looks at: a description of one host.

A :class:`HostInfo` is read from the live machine (``/proc/cpuinfo``, ``/sys``,
``sysctl`` on macOS) or from recorded files, so anyone can ask "what would be
chosen on that machine" (``glowlm platforms --cpuinfo FILE``). Detectors only
read it; it is frozen. The ``/proc/cpuinfo`` text parsing lives in
:mod:`glowlm.platforms.cpuinfo` (re-exported here).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import platform as _platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from glowlm.errors import ConfigError
from glowlm.platforms.cpuinfo import guess_machine, parse_cpuinfo


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    memory_bytes: int


@dataclass(frozen=True)
class HostInfo:
    """A CPU host as detectors see it.

    ``machine`` is what ``uname -m`` prints (``x86_64``, ``aarch64``, ``arm64``,
    ``s390x``, ``ppc64le``, ``riscv64``), ``system`` what ``platform.system()``
    returns (``Linux``, ``Darwin``). ``flags`` holds whole-word CPU feature flags
    (``avx512f``, ``asimd``, ``bf16``, ``vxe``...), lower case. ``modules`` is the
    set of Python modules assumed importable for a recorded host; ``None`` means
    "probe the live interpreter". ``cpu_family`` is the x86 CPUID family (``cpu
    family`` in ``/proc/cpuinfo``; 0 where there is none): AMD's 25 is Zen 3 / Zen 4,
    26 is Zen 5.
    """

    machine: str
    system: str
    vendor: str = ""
    model_name: str = ""
    flags: frozenset[str] = frozenset()
    cpu_family: int = 0
    logical_cpus: int = 0
    physical_cores: int = 0
    numa_nodes: tuple[NumaNode, ...] = ()
    source: str = "live"
    modules: frozenset[str] | None = None
    sysctl: Mapping[str, str] = field(default_factory=dict)

    def has_flag(self, flag: str) -> bool:
        """Whole-word match: ``avx`` is not ``avx2``, ``bf16`` is not ``avx512_bf16``."""
        return flag.lower() in self.flags

    def has_module(self, name: str) -> bool:
        """Whether ``import name`` succeeds here (or is assumed to, for a recorded host).

        Live probing really imports the module (a package can be present and still
        fail to load, e.g. against the wrong torch), so detectors call this last.
        """
        if self.modules is not None:
            return name in self.modules
        try:
            if importlib.util.find_spec(name) is None:
                return False
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any import failure means "not usable"
            return False
        return True


def parse_sysctl(text: str) -> dict[str, str]:
    """``sysctl -a`` output (``key: value`` lines) as a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _host_from_sysctl(values: Mapping[str, str], machine: str, source: str) -> HostInfo:
    """macOS: ``hw.optional.*`` keys set to 1 become flags (``arm.FEAT_BF16`` -> ``bf16``).

    NEON is architectural on arm64, so ``asimd`` (the Linux name detectors use) is
    set unless the dump says ``hw.optional.neon: 0``.
    """
    flags = {
        k.rsplit(".", 1)[-1].lower().removeprefix("feat_")
        for k, v in values.items()
        if k.startswith("hw.optional.") and v.strip() == "1"
    }
    if machine == "arm64" and values.get("hw.optional.neon", "1") == "1":
        flags.add("asimd")
    return HostInfo(
        machine=machine,
        system="Darwin",
        vendor="Apple" if machine == "arm64" else values.get("machdep.cpu.vendor", ""),
        model_name=values.get("machdep.cpu.brand_string", ""),
        flags=frozenset(flags),
        logical_cpus=int(values.get("hw.logicalcpu", "0") or 0),
        physical_cores=int(values.get("hw.physicalcpu", "0") or 0),
        source=source,
        sysctl=dict(values),
    )


def read_numa_nodes(sys_root: str = "/sys") -> tuple[NumaNode, ...]:
    """NUMA nodes with their CPUs and memory, as detectors see them.

    One owner reads ``/sys``: :func:`glowlm.runtime.topology.read` (which the thread
    binding and memory plan use too); this is its node list in the host's terms. A tree
    without ``devices/system/node`` (no NUMA information) gives no nodes.
    """
    if not (Path(sys_root) / "devices/system/node").is_dir():
        return ()
    from glowlm.runtime import topology

    return tuple(NumaNode(n.id, n.cpus, n.total_bytes) for n in topology.read(sys_root).nodes)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} dump {path!r}: {exc.strerror}") from None


def from_files(
    *,
    machine: str | None = None,
    system: str | None = None,
    cpuinfo: str | None = None,
    sysctl: str | None = None,
    modules: frozenset[str] = frozenset(),
) -> HostInfo:
    """A recorded host: a ``/proc/cpuinfo`` or ``sysctl -a`` dump plus ``uname -m``.

    ``machine`` defaults to what the dump implies (``hw.machine`` for sysctl, the
    vendor/implementer fields for cpuinfo); ``system`` to Darwin for a sysctl dump
    and Linux otherwise. ``modules`` are the Python modules assumed importable there
    (a recorded host never probes this interpreter).
    """
    if sysctl is not None:
        values = parse_sysctl(_read(sysctl, "sysctl"))
        implied = values.get("hw.machine", "")
        if not implied:  # older dumps lack hw.machine; the ISA flags still tell
            if values.get("hw.optional.arm64") == "1":
                implied = "arm64"
            elif "Intel" in values.get("machdep.cpu.vendor", "") or values.get(
                    "hw.optional.x86_64") == "1":
                implied = "x86_64"
        host = _host_from_sysctl(values, machine or implied, sysctl)
        return dataclasses.replace(host, system=system or "Darwin", modules=frozenset(modules))
    text = _read(cpuinfo, "cpuinfo") if cpuinfo else ""
    machine = machine or guess_machine(text)
    if not machine:
        raise ConfigError("cannot tell the architecture of this cpuinfo dump; "
                          "pass --machine (x86_64, aarch64, s390x, ppc64le, riscv64)")
    info = parse_cpuinfo(text)
    return HostInfo(machine=machine, system=system or "Linux", source=cpuinfo or "none",
                    modules=frozenset(modules), **info)  # type: ignore[arg-type]


def from_dump(path: str | os.PathLike[str], modules: frozenset[str] = frozenset()
              ) -> HostInfo:
    """A recorded host from one dump file, ``sysctl -a`` or ``/proc/cpuinfo`` by content.

    The one-liner plugin tests use: ``from_dump("hosts/graviton3.cpuinfo")``.
    """
    text = _read(str(path), "host")
    is_sysctl = any(line.startswith(("hw.", "machdep.")) for line in text.splitlines())
    kind = "sysctl" if is_sysctl else "cpuinfo"
    return from_files(modules=frozenset(modules), **{kind: str(path)})


def live() -> HostInfo:
    """This machine, read once per call (detectors must be cheap; callers cache)."""
    machine = _platform.machine()
    system = _platform.system()
    if system == "Darwin":
        import subprocess

        try:
            out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=10)
            values = parse_sysctl(out.stdout)
        except (OSError, subprocess.SubprocessError):
            values = {}
        return _host_from_sysctl(values, machine, "sysctl -a")
    info: dict[str, object] = {}
    try:
        info = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        info = {"logical_cpus": os.cpu_count() or 1, "physical_cores": os.cpu_count() or 1}
    return HostInfo(machine=machine, system=system, numa_nodes=read_numa_nodes(),
                    source="/proc/cpuinfo", **info)  # type: ignore[arg-type]


__all__ = ["HostInfo", "NumaNode", "from_dump", "from_files", "guess_machine", "live",
           "parse_cpuinfo", "parse_sysctl", "read_numa_nodes"]
