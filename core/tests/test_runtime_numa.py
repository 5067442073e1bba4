"""NUMA binding for real, including the refusal containers give (EPERM from seccomp).

The refusal is produced the way Docker produces it: a seccomp filter that makes
``get_mempolicy``/``set_mempolicy``/``mbind``/``migrate_pages`` fail with EPERM,
installed in a child Python (classic BPF through ``prctl``, no libseccomp) before
it imports glowlm; the child then binds and must warn once and carry on.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
from glowlm.runtime import numa

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="seccomp filter written for x86_64/aarch64 Linux")

FILTER = r"""
import ctypes, platform
from glowlm.runtime.numa import SYSCALLS
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[platform.machine()]
nrs = [SYSCALLS[platform.machine()][n]
       for n in ("get_mempolicy", "set_mempolicy", "mbind", "migrate_pages")]
LD_ABS, JEQ, RET = 0x20, 0x15, 0x06
ALLOW, ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1
class Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
allow_at = 3 + len(nrs)
prog = [Insn(LD_ABS, 0, 0, 4),                       # seccomp_data.arch
        Insn(JEQ, 0, allow_at - 2, ARCH),            # another ABI: allow
        Insn(LD_ABS, 0, 0, 0)]                       # seccomp_data.nr
prog += [Insn(JEQ, allow_at - (3 + i), 0, nr) for i, nr in enumerate(nrs)]
prog += [Insn(RET, 0, 0, ALLOW), Insn(RET, 0, 0, ERRNO_EPERM)]
arr = (Insn * len(prog))(*prog)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS"
assert libc.prctl(22, 2, ctypes.byref(Prog(len(prog), arr)), 0, 0) == 0, ctypes.get_errno()
"""

BODY = r"""
import json
from glowlm.runtime import numa, pinning
first = numa.bind_memory(0)
second = numa.bind_memory(0)
policy = numa.current_policy()
notes = pinning.apply((0,), 0)   # what binding.apply_for_process runs for a rank on node 0
import torch
print(json.dumps({"first": first.detail, "bound": first.bound, "second": second.bound,
                  "policy": policy.detail, "notes": notes, "threads": torch.get_num_threads()}))
print("CONTINUED")
"""


def run_child(with_filter: bool) -> tuple[dict[str, object], str]:
    code = (FILTER if with_filter else "") + BODY
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "GLOWLM_LOG_LEVEL": "INFO"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "CONTINUED"
    return json.loads(lines[-2]), out.stderr


def test_refused_numa_calls_warn_once_with_the_fix_and_continue() -> None:
    got, stderr = run_child(with_filter=True)
    assert got["bound"] is False and got["second"] is False
    assert "EPERM" in str(got["first"])
    assert "forbidden" in str(got["policy"])
    assert any("refused" in str(n) for n in got["notes"])  # type: ignore[union-attr]
    assert got["threads"] == 1  # the rest of the binding still applied
    assert stderr.count("NUMA binding refused") == 1
    assert "--cap-add SYS_NICE --security-opt seccomp=unconfined" in stderr
    assert "capabilities: {add: [SYS_NICE]}" in stderr and "Unconfined" in stderr


def test_binding_works_where_allowed() -> None:
    got, stderr = run_child(with_filter=False)
    if "EPERM" in str(got["first"]):
        pytest.skip("this environment itself forbids NUMA system calls")
    assert got["bound"] is True and "bind to node 0" in str(got["first"])
    assert got["policy"] == "bind to node(s) 0"
    assert "NUMA binding refused" not in stderr


def test_policy_of_this_process_is_readable() -> None:
    status = numa.current_policy()
    assert status.detail  # "default (not bound)" here; never raises


def test_unknown_node_is_a_warning_not_an_error() -> None:
    status = numa.bind_memory(999)
    assert status.bound is False and status.node is None
