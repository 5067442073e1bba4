"""NUMA memory binding through the raw system calls (ctypes), no libnuma needed.

Why syscalls and not libnuma: libnuma is rarely installed in slim images, and the
three calls we need (``set_mempolicy``, ``migrate_pages``, ``get_mempolicy``) are
stable kernel ABI. Containers often refuse them: Docker's default seccomp profile
returns EPERM for them unless the container has CAP_SYS_NICE. Then glowlm warns
once with the exact fix and runs unbound: slower on multi-socket machines, but
correct.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from dataclasses import dataclass

from glowlm.logger import init_logger

logger = init_logger(__name__)

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
POLICY_NAMES = {0: "default", 1: "preferred", 2: "bind", 3: "interleave", 4: "local",
                5: "preferred-many", 6: "weighted-interleave"}
MAX_NODES = 1024  # nodemask size we pass; the kernel reads maxnode - 1 bits

# Syscall numbers by `uname -m` (from each architecture's unistd tables).
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"mbind": 237, "set_mempolicy": 238, "get_mempolicy": 239, "migrate_pages": 256},
    "aarch64": {"mbind": 235, "get_mempolicy": 236, "set_mempolicy": 237, "migrate_pages": 238},
    "s390x": {"mbind": 268, "get_mempolicy": 269, "set_mempolicy": 270, "migrate_pages": 287},
    "ppc64le": {"migrate_pages": 258, "mbind": 259, "get_mempolicy": 260,
                "set_mempolicy": 261},
}

FIX = ("to allow NUMA binding, run the container with `--cap-add SYS_NICE --security-opt "
       "seccomp=unconfined` (Docker/Podman), or in Kubernetes set the container's "
       "securityContext: capabilities: {add: [SYS_NICE]} and seccompProfile: "
       "{type: Unconfined}")

_warned: set[str] = set()


@dataclass(frozen=True)
class NumaStatus:
    """What binding did: ``bound`` False means memory follows the kernel default."""

    bound: bool
    node: int | None
    detail: str


class _Mask(ctypes.Structure):
    _fields_ = [("bits", ctypes.c_ulong * (MAX_NODES // (8 * ctypes.sizeof(ctypes.c_ulong))))]

    @classmethod
    def of(cls, nodes: list[int]) -> _Mask:
        mask = cls()
        width = 8 * ctypes.sizeof(ctypes.c_ulong)
        for n in nodes:
            mask.bits[n // width] |= 1 << (n % width)
        return mask

    def nodes(self) -> list[int]:
        width = 8 * ctypes.sizeof(ctypes.c_ulong)
        return [i * width + b for i, word in enumerate(self.bits) for b in range(width)
                if word >> b & 1]


def _syscall(name: str, *args: object) -> int:
    """Call ``name``; return 0 or the errno (ENOSYS when this architecture is unknown)."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None or os.name != "posix":
        return errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(numbers[name]), *args)
    return ctypes.get_errno() if ret < 0 else 0


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning("%s", message)


def _explain(call: str, err: int, node: int) -> str:
    if err == errno.EPERM:
        _warn_once("eperm", f"NUMA binding refused: {call} failed with EPERM (the container "
                            f"forbids NUMA system calls); continuing without NUMA binding. "
                            f"Fix: {FIX}")
        return f"refused by the kernel ({call}: EPERM); see the start-up warning for the fix"
    if err == errno.ENOSYS:
        _warn_once("enosys", "NUMA binding unavailable: this kernel or architecture has no "
                             "NUMA system calls; continuing without NUMA binding")
        return "unavailable (no NUMA system calls here)"
    if err == errno.EINVAL:
        _warn_once("einval", f"NUMA binding to node {node} failed with EINVAL: the node is "
                             "not in this cgroup's cpuset.mems; continuing without binding")
        return f"node {node} not allowed by the cgroup (EINVAL)"
    reason = os.strerror(err)
    _warn_once(f"err{err}", f"NUMA binding failed ({call}: {reason}); continuing unbound")
    return f"failed ({call}: {reason})"


def _online_nodes() -> list[int]:
    try:
        with open("/sys/devices/system/node/online") as f:
            from glowlm.runtime.topology import parse_cpulist

            return list(parse_cpulist(f.read()))
    except (OSError, ValueError):
        return []


def bind_memory(node: int, strict: bool = True) -> NumaStatus:
    """Bind this process's future allocations to ``node`` and move its pages there.

    ``strict`` uses MPOL_BIND (allocations never spill to another node: the memory
    plan has already checked the rank fits its node, and a spill would silently
    halve bandwidth); otherwise MPOL_PREFERRED. Moving the pages already allocated
    (``migrate_pages``) is best effort. Never raises: a refusal is a warning.
    """
    mode = MPOL_BIND if strict else MPOL_PREFERRED
    target = _Mask.of([node])
    err = _syscall("set_mempolicy", ctypes.c_int(mode), ctypes.byref(target),
                   ctypes.c_ulong(MAX_NODES + 1))
    if err:
        return NumaStatus(False, None, _explain("set_mempolicy", err, node))
    # Only online nodes: bits past the kernel's MAX_NUMNODES must be zero (EINVAL).
    everywhere = _Mask.of(_online_nodes() or [node])
    err = _syscall("migrate_pages", ctypes.c_int(0), ctypes.c_ulong(MAX_NODES + 1),
                   ctypes.byref(everywhere), ctypes.byref(target))
    moved = "" if not err else f"; existing pages not moved (migrate_pages: {os.strerror(err)})"
    return NumaStatus(True, node, f"memory policy {POLICY_NAMES[mode]} to node {node}{moved}")


def current_policy() -> NumaStatus:
    """This thread's memory policy as the kernel reports it (for collect-env)."""
    mode = ctypes.c_int(0)
    mask = _Mask()
    err = _syscall("get_mempolicy", ctypes.byref(mode), ctypes.byref(mask),
                   ctypes.c_ulong(MAX_NODES + 1), ctypes.c_void_p(0), ctypes.c_ulong(0))
    if err:
        why = "EPERM: forbidden in this container" if err == errno.EPERM else os.strerror(err)
        return NumaStatus(False, None, f"unknown (get_mempolicy: {why})")
    name = POLICY_NAMES.get(mode.value & 0xFF, str(mode.value))
    nodes = mask.nodes()
    if mode.value & 0xFF in (MPOL_DEFAULT, MPOL_LOCAL):
        return NumaStatus(False, None, f"{name} (not bound)")
    return NumaStatus(True, nodes[0] if len(nodes) == 1 else None,
                      f"{name} to node(s) {','.join(map(str, nodes))}")
