"""Two real ranks running the shared-memory collectives against torch.distributed's gloo.

For tests (core/tests/test_shm_fence.py): spawned processes must import the rank's
function by module name, so it lives in the test kit. Each rank forms a gloo group and a
:class:`~glowlm.distributed.shm.ShmGroup` with an explicit fence (the weakly ordered
path on any CPU), and every all-reduce, all-gather and broadcast must give gloo's
values, bit for bit in fp32.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
from typing import Any

import torch

from glowlm.distributed import fence as fence_mod
from glowlm.distributed.shm import ShmGroup, create_segment, unlink_segment


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gloo_gather(dist: Any, x: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(out, x)
    return out


def _rank(rank: int, path: str, port: int, steps: int, queue: Any) -> None:
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
        calls = [0]
        real = fence_mod.libatomic_fence()

        def fence() -> None:
            calls[0] += 1
            real()

        # 256-byte slots: tensors go through in several chunks, both buffers reused.
        group = ShmGroup(path, 2, rank, slot_bytes=256, spin_seconds=0.0, fence=fence)
        g = torch.Generator().manual_seed(100 + rank)
        for step in range(steps):
            n = (1, 63, 64, 200, 1000)[step % 5]
            x = torch.randn(n, generator=g)
            want = x.clone()
            dist.all_reduce(want)
            got = group.all_reduce(x.clone())
            assert torch.equal(got, want), f"step {step}: fp32 all-reduce differs from gloo"
            parts = _gloo_gather(dist, x.bfloat16().float())
            want16 = (parts[0] + parts[1]).bfloat16()
            assert torch.equal(group.all_reduce(x.bfloat16()), want16), f"step {step}: bf16"
            gathered = group.all_gather(x)
            assert all(
                torch.equal(a, b) for a, b in zip(gathered, _gloo_gather(dist, x), strict=True)
            ), f"step {step}"
            blob = bytes(range(256)) * (step + 1)
            got_blob = group.broadcast_bytes(blob if rank == 0 else None, root=0)
            assert got_blob == blob, f"step {step}: broadcast"
        group.barrier()
        queue.put((rank, "ok", calls[0]))
    except BaseException as exc:  # reported to the parent, which fails the test
        queue.put((rank, repr(exc), 0))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def fenced_collectives_against_gloo(
    steps: int = 40, timeout: float = 120.0
) -> list[tuple[int, str, int]]:
    """``[(rank, "ok" or the error, fence calls)]`` of two spawned ranks."""
    path = create_segment(2, "fence", slot_bytes=256)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, path, port, steps, queue)) for r in range(2)]
    try:
        for p in procs:
            p.start()
        return sorted(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        unlink_segment(path)
