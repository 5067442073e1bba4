"""The compiled shared-memory all-reduce (``csrc/cpu/shm_reduce.h``) with two ranks on
every CPU family: natively on x86, under qemu-user on aarch64 (NEON) and s390x.

The Arm and IBM Z modules compile the same source as x86's (``torch/collective.cpp``)
and their ops tables hand it to the engine. Its stamps are release stores and its waits
acquire loads, so each ISA gets the fences its memory model needs from the compiler;
the aarch64 build is checked to contain them (``stlr`` / ``ldar``). The driver
(``csrc/test/shm_driver.cpp``) forks two ranks on one shared mapping and checks every
sum exactly (fp32, bf16, fp16; sizes that take several chunks, both buffers reused).
qemu-user runs the guest's threads on the host's CPUs, so it shows the protocol runs
and agrees on aarch64, not that a real weakly ordered core cannot break it: that is
what the release/acquire pairs are for.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from glowlm.plugin_api import core_env
from glowlm_kernels.build import CSRC, VARIANTS, program_command

#: name -> (compiler, (plugin, ISA) whose flags build it, emulator command or ())
TARGETS: dict[str, tuple[str, tuple[str, str], tuple[str, ...]]] = {
    "x86-avx2": ("g++", ("x86", "avx2"), ()),
    "aarch64-neon": (
        "aarch64-linux-gnu-g++",
        ("arm", "neon"),
        ("qemu-aarch64", "-cpu", "cortex-a72", "-L", "/usr/aarch64-linux-gnu"),
    ),
    "s390x-z14": (
        "s390x-linux-gnu-g++",
        ("s390x", "z14"),
        ("qemu-s390x", "-cpu", "max", "-L", "/usr/s390x-linux-gnu"),
    ),
}
SOURCE = CSRC / "test" / "shm_driver.cpp"


def _driver(target: str) -> Path:
    cxx, (plugin, isa), _ = TARGETS[target]
    if shutil.which(cxx) is None:
        pytest.skip(f"{cxx} not installed (make test-cross installs it)")

    def command(out: Path) -> list[str]:
        return program_command(VARIANTS[plugin][isa], SOURCE, out, cxx)

    h = hashlib.sha256(" ".join(command(Path("-"))).encode())
    for p in (SOURCE, CSRC / "cpu" / "shm_reduce.h", CSRC / "cpu" / "types.h"):
        h.update(p.read_bytes())
    out = Path(core_env().kernel_cache) / "cross" / f"shm-{target}-{h.hexdigest()[:16]}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        proc = subprocess.run(command(tmp), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        tmp.rename(out)
    return out


@pytest.mark.parametrize("target", list(TARGETS))
def test_two_ranks_sum_exactly(target: str) -> None:
    emulator = TARGETS[target][2]
    if emulator and shutil.which(emulator[0]) is None:
        pytest.skip(f"{emulator[0]} not installed (Debian qemu-user; make test-cross)")
    driver = _driver(target)
    proc = subprocess.run(
        [*emulator, str(driver), "600"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok 600", proc.stderr[-2000:]


def test_the_aarch64_build_has_release_stores_and_acquire_loads() -> None:
    if shutil.which("aarch64-linux-gnu-objdump") is None:
        pytest.skip("aarch64-linux-gnu-objdump not installed (binutils-aarch64-linux-gnu)")
    text = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", str(_driver("aarch64-neon"))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "stlr" in text and "ldar" in text
