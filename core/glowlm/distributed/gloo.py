"""Collectives over torch.distributed (gloo) for groups whose ranks are on different hosts.

Ranks on one host talk through shared memory (:mod:`glowlm.distributed.shm`);
a group that spans hosts (a TP group split across hosts, the pair of pipeline
stages on either side of a host boundary) has no memory in common, so it uses
gloo's TCP transport instead. :class:`GlooGroup` offers the same operations as
:class:`~glowlm.distributed.shm.ShmGroup` (``rank`` is the index in the group),
so layers and the model runner do not know which one they hold.

Half-precision values are summed in float32, as the shared-memory all-reduce
does. A peer that dies closes its TCP connections, and the gloo call fails at
once; that failure becomes :class:`RankFailure` with the line the executor
recorded. A peer that hangs is caught by the group's timeout
(:data:`TIMEOUT_SECONDS`), which must exceed the longest step.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

from glowlm.distributed.shm import RankFailure

#: How long a gloo operation may wait for a peer (a long prefill on a big model counts).
TIMEOUT_SECONDS = 1800.0


def init_gloo(rank: int, world: int, addr: str, port: int) -> None:
    """Join the torch.distributed (gloo) group and check it with one all-reduce."""
    import torch.distributed as dist

    from glowlm.errors import GlowlmError

    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=TIMEOUT_SECONDS))
    check = torch.ones(1)
    dist.all_reduce(check)
    if int(check.item()) != world:
        raise GlowlmError(f"the gloo group is inconsistent ({int(check.item())} of {world})")


class GlooGroup:
    """The collectives of the global ``ranks`` (this process is ``ranks[rank]``).

    Built before torch.distributed is initialised (layers keep a reference to
    it); :meth:`connect` creates the process group once it is, and every rank of
    the world must call it for every such group, in the same order.
    """

    def __init__(self, ranks: Sequence[int], rank: int, name: str = "group") -> None:
        self.ranks, self.rank, self.name = list(ranks), rank, name
        self.world = len(self.ranks)
        self.dead_reason = "another rank stopped"
        self._aborted = False
        self._pg: Any = None

    def connect(self) -> None:
        import torch.distributed as dist

        self._pg = dist.new_group(self.ranks, timeout=timedelta(seconds=TIMEOUT_SECONDS))

    # -- failure --------------------------------------------------------------------------

    def abort(self) -> None:
        """Mark the group failed; later calls raise (a gloo call in progress ends when
        its peer's connections close)."""
        self._aborted = True

    @property
    def aborted(self) -> bool:
        return self._aborted

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._aborted:
            raise RankFailure(self.dead_reason)
        if self._pg is None:
            raise RankFailure(f"the {self.name} group across hosts is not connected")
        try:
            return fn(*args, group=self._pg, **kwargs)
        except RankFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - gloo raises RuntimeError / DistError
            self._aborted = True
            reason = self.dead_reason if self.dead_reason != "another rank stopped" else (
                f"the {self.name} group across hosts failed: {str(exc).splitlines()[0]}")
            raise RankFailure(reason) from None

    # -- collectives ----------------------------------------------------------------------

    def barrier(self) -> None:
        import torch.distributed as dist

        self._run(dist.barrier)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group in place (half types in float32)."""
        import torch.distributed as dist

        if x.dtype in (torch.bfloat16, torch.float16):
            acc = x.float()
            self._run(dist.all_reduce, acc)
            x.copy_(acc)
            return x
        if x.is_contiguous():
            self._run(dist.all_reduce, x)
            return x
        flat = x.contiguous()
        self._run(dist.all_reduce, flat)
        x.copy_(flat)
        return x

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        x = x.contiguous()
        outs = [torch.empty_like(x) for _ in range(self.world)]
        self._run(dist.all_gather, [o.view(torch.uint8) if o.dtype == torch.bfloat16 else o
                                    for o in outs],
                  x.view(torch.uint8) if x.dtype == torch.bfloat16 else x)
        return outs

    def _broadcast(self, t: torch.Tensor, root: int) -> None:
        """Raw bytes of a contiguous tensor from group index ``root``."""
        import torch.distributed as dist

        self._run(dist.broadcast, t.view(-1).view(torch.uint8), src=self.ranks[root])

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        size = torch.tensor([len(data) if self.rank == root and data is not None else 0],
                            dtype=torch.int64)
        self._broadcast(size, root)
        if self.rank == root:
            assert data is not None
            if data:
                self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), root)
            return data
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if buf.numel():
            self._broadcast(buf, root)
        return buf.numpy().tobytes()

    def send_tensors(self, tensors: Sequence[torch.Tensor], root: int) -> None:
        for t in tensors:
            if t.numel():
                self._broadcast(t.contiguous(), root)

    def recv_tensors(self, like: Sequence[tuple[tuple[int, ...], torch.dtype]], root: int
                     ) -> list[torch.Tensor]:
        outs = []
        for shape, dtype in like:
            t = torch.empty(shape, dtype=dtype)
            if t.numel():
                self._broadcast(t, root)
            outs.append(t)
        return outs
