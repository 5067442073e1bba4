"""Linux ``/proc/cpuinfo`` text -> the facts detectors use.

Every architecture prints a different layout (x86 ``flags``, Arm ``Features`` and
part numbers, s390x ``features`` and machine types, POWER ``cpu``, RISC-V ``isa``).
Parsing is tolerant: an unfamiliar dump yields fewer facts, never an exception,
because detection must not fail on a strange host.
"""

from __future__ import annotations

import re

# Arm "CPU implementer" codes and, for the common server cores, "CPU part" codes
# (from the Arm and vendor technical reference manuals), so an aarch64 host gets a
# readable model name: Linux prints no "model name" line there.
_ARM_IMPLEMENTERS = {"0x41": "ARM", "0x46": "Fujitsu", "0x48": "HiSilicon", "0x4e": "NVIDIA",
                     "0x51": "Qualcomm", "0x61": "Apple", "0xc0": "Ampere"}
_ARM_PARTS = {("0x41", "0xd03"): "Cortex-A53", ("0x41", "0xd08"): "Cortex-A72",
              ("0x41", "0xd0b"): "Cortex-A76", ("0x41", "0xd0c"): "Neoverse-N1",
              ("0x41", "0xd40"): "Neoverse-V1", ("0x41", "0xd49"): "Neoverse-N2",
              ("0x41", "0xd4f"): "Neoverse-V2", ("0x41", "0xd84"): "Neoverse-V3",
              ("0x41", "0xd8e"): "Neoverse-N3", ("0xc0", "0xac3"): "AmpereOne",
              ("0x48", "0xd01"): "Kunpeng-920", ("0x46", "0x001"): "A64FX"}
# IBM Z machine types (the "machine = NNNN" field) -> generation.
_S390_MACHINES = {"2964": "z13", "2965": "z13s", "3906": "z14", "3907": "z14 ZR1",
                  "8561": "z15", "8562": "z15 T02", "3931": "z16", "3932": "z16 A02",
                  "9175": "z17", "9176": "z17"}


def _split_kv(line: str) -> tuple[str, str] | None:
    if ":" not in line:
        return None
    key, _, value = line.partition(":")
    return key.strip().lower(), value.strip()


def _riscv_flags(isa: str) -> set[str]:
    """``rv64imafdcv_zba_zbb`` -> single-letter extensions plus the ``z*``/``s*`` names."""
    base, *extensions = isa.lower().split("_")
    letters = re.sub(r"^rv(32|64|128)", "", base)
    return set(letters) | {e for e in extensions if e}


def parse_cpuinfo(text: str) -> dict[str, object]:
    """Vendor, model name, flags and counts from a Linux ``/proc/cpuinfo`` dump.

    Flags are the first x86 ``flags``, Arm ``Features`` or s390x ``features`` line,
    split into whole words. RISC-V flags come from the ``isa`` string; POWER has
    none but ``altivec``. The model name is the x86 ``model name``, the RISC-V
    ``uarch``, the POWER ``cpu``, the Arm part number or the IBM Z machine type.
    ``cpu_family`` is the x86 ``cpu family`` (CPUID's family, 0 elsewhere): what tells
    one microarchitecture from the next where the model name does not (a KVM guest
    often shows "AMD EPYC" alone).
    """
    first: dict[str, str] = {}
    processors = 0
    cores: set[tuple[str, str]] = set()
    physical_id = "0"
    for line in text.splitlines():
        kv = _split_kv(line)
        if kv is None:
            continue
        key, value = kv
        first.setdefault(key, value)
        if key == "processor":
            processors += 1
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            cores.add((physical_id, value))
    flags: set[str] = set()
    for key in ("flags", "features"):
        if key in first:
            flags = {f.lower() for f in first[key].split()}
            break
    if "isa" in first:
        flags |= _riscv_flags(first["isa"])
    if "altivec supported" in first.get("cpu", ""):
        flags.add("altivec")
    vendor = first.get("vendor_id") or first.get("vendor") or ""
    if not vendor and first.get("cpu", "").startswith("POWER"):
        vendor = "IBM"
    implementer = first.get("cpu implementer", "").lower()
    if not vendor and implementer:
        vendor = _ARM_IMPLEMENTERS.get(implementer, implementer)
    model = (first.get("model name") or first.get("uarch") or first.get("cpu")
             or first.get("isa") or "")
    if not model and implementer:
        part = first.get("cpu part", "").lower()
        model = _ARM_PARTS.get((implementer, part), f"part {part}")
    if vendor == "IBM/S390":
        m = re.search(r"machine\s*=\s*(\w+)", text)
        mtype = m.group(1) if m else first.get("machine", "")
        if mtype:
            model = f"IBM {_S390_MACHINES.get(mtype, 'Z')} (machine type {mtype})"
        m = re.search(r"#\s*processors\s*:\s*(\d+)", text)
        processors = int(m.group(1)) if m else processors
    family = first.get("cpu family", "")
    return {
        "vendor": vendor,
        "model_name": model,
        "cpu_family": int(family) if family.isdigit() else 0,
        "flags": frozenset(flags),
        "logical_cpus": processors,
        "physical_cores": len(cores) or processors,
    }


def guess_machine(cpuinfo_text: str) -> str:
    """The ``uname -m`` a ``/proc/cpuinfo`` dump came from, or ``''`` if unclear.

    Lets ``glowlm platforms --cpuinfo FILE`` work without ``--machine``.
    """
    info = {k: v for k, v in filter(None, map(_split_kv, cpuinfo_text.splitlines()))}
    if info.get("vendor_id") in ("GenuineIntel", "AuthenticAMD", "HygonGenuine"):
        return "x86_64"
    if info.get("vendor_id") == "IBM/S390":
        return "s390x"
    if "cpu implementer" in info:
        return "aarch64"
    if info.get("isa", "").startswith("rv64"):
        return "riscv64"
    if info.get("cpu", "").startswith("POWER"):
        return "ppc64le"
    return ""
