"""The shared-memory collectives on every ISA and OS: the fence of weakly ordered CPUs
and macOS's lack of an affinity API.

x86 orders the protocol by itself, so the weakly ordered path (a compiled full fence
around every stamp, glowlm.distributed.fence) is forced here, in two real ranks that
also form a torch.distributed gloo group: every collective must give gloo's values.
That proves the fenced path runs and agrees; that the fence is the one aarch64 needs
is the disassembly's (libatomic's ``atomic_thread_fence`` is ``dmb ish``), and the
compiled all-reduce's release/acquire atomics run on aarch64 in
kernels/tests/test_cross_shm.py.
"""

from __future__ import annotations

import os

import pytest
from glowlm.distributed import fence as fence_mod
from glowlm.distributed.shm import SPIN_SECONDS, ShmGroup, create_segment, unlink_segment
from glowlm.runtime import topology
from glowlm.testing.collectives import fenced_collectives_against_gloo


def test_which_cpus_need_a_fence() -> None:
    assert not fence_mod.needs_fence("x86_64") and not fence_mod.needs_fence("s390x")
    assert fence_mod.needs_fence("aarch64") and fence_mod.needs_fence("ppc64le")
    assert fence_mod.host_fence("x86_64", "Linux") is None
    with pytest.raises(fence_mod.FenceUnavailable, match="no memory fence"):
        fence_mod.host_fence("riscv64", "FreeBSD")


def test_the_linux_fence_is_libatomics() -> None:
    try:
        fence = fence_mod.host_fence("aarch64", "Linux")
    except fence_mod.FenceUnavailable as exc:
        pytest.skip(str(exc))
    assert fence is not None
    fence()  # a real call: lock or on x86-64, dmb ish on aarch64


def test_without_an_affinity_api_the_cpu_count_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS's os module has no sched_getaffinity: groups still start (TP/PP run)."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert topology.usable_cpu_count() == (os.cpu_count() or 1)
    path = create_segment(2, "noaff", slot_bytes=4096)
    try:
        group = ShmGroup(path, 2, 0, slot_bytes=4096)
        assert group.spin_seconds == (SPIN_SECONDS if (os.cpu_count() or 1) >= 2 else 0.0)
    finally:
        unlink_segment(path)


def test_two_ranks_on_the_fenced_path_agree_with_gloo() -> None:
    try:
        fence_mod.libatomic_fence()
    except fence_mod.FenceUnavailable as exc:
        pytest.skip(str(exc))
    results = fenced_collectives_against_gloo(steps=40)
    assert [r[1] for r in results] == ["ok", "ok"], results
    # Each op fences at its publish and at its completed wait.
    assert all(r[2] >= 2 * 40 for r in results), results
