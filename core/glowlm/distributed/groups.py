"""The communication groups of a TP x PP layout, and which transport each one uses.

Every TP group (the ranks of one stage) and every pipeline pair (the same TP index
on neighbouring stages) is a group; ranks are numbered stage-major
(``rank = stage * tp + t``) and host n holds ranks n*L .. n*L+L-1. A group whose
ranks are all on one host uses a shared-memory segment there
(:mod:`glowlm.distributed.shm`); one that spans hosts uses gloo
(:mod:`glowlm.distributed.gloo`). :class:`Layout` is a host's view (created by the
process that starts the host's ranks, passed to each); :class:`RankComms` is the
groups one rank takes part in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from glowlm.distributed.gloo import GlooGroup
from glowlm.distributed.parallel import ParallelState
from glowlm.distributed.shm import ShmGroup, create_segment, unlink_segment

Key = tuple[Any, ...]


def group_ranks(tp: int, pp: int) -> dict[Key, list[int]]:
    """Every communication group of a TP x PP layout: ``("tp", stage)`` (TP > 1),
    ``("pp", t, s)`` linking stage s and s+1 for TP index t, and ``("pp", t, pp-1)``
    linking the last stage back to the first (PP > 2; with two stages the pair is the
    same). Ranks are listed lower stage first."""
    groups: dict[Key, list[int]] = {}
    if tp > 1:
        for s in range(pp):
            groups[("tp", s)] = [s * tp + t for t in range(tp)]
    for t in range(tp):
        for s in range(pp - 1):
            groups[("pp", t, s)] = [s * tp + t, (s + 1) * tp + t]
        if pp > 2:
            groups[("pp", t, pp - 1)] = [t, (pp - 1) * tp + t]
    return groups


def _tag(key: Key) -> str:
    return f"tp{key[1]}" if key[0] == "tp" else f"pp{key[1]}-{key[2]}"


@dataclass(frozen=True)
class Layout:
    """This host's view of a TP x PP group: the shared-memory segments (paths in
    /dev/shm) of the groups wholly on this host, and which groups span hosts."""

    tp: int
    pp: int
    nnodes: int = 1
    node_rank: int = 0
    #: The step broadcast among this host's ranks (and its relay on nodes > 0); ''
    #: when this host holds only the driver.
    world_path: str = ""
    shm_paths: dict[Key, str] = field(default_factory=dict)
    gloo_keys: tuple[Key, ...] = ()

    @classmethod
    def create(cls, tp: int, pp: int, nnodes: int = 1, node_rank: int = 0) -> Layout:
        local = tp * pp // nnodes
        shm: dict[Key, str] = {}
        gloo: list[Key] = []
        try:
            for key, ranks in group_ranks(tp, pp).items():
                hosts = {r // local for r in ranks}
                if len(hosts) > 1:
                    gloo.append(key)
                elif hosts == {node_rank}:
                    shm[key] = create_segment(len(ranks), _tag(key))
            members = local + (1 if node_rank > 0 else 0)
            world = create_segment(members, "world") if members > 1 else ""
        except BaseException:
            for p in shm.values():
                unlink_segment(p)
            raise
        return cls(tp, pp, nnodes, node_rank, world, shm, tuple(gloo))

    @property
    def local_world(self) -> int:
        return self.tp * self.pp // self.nnodes

    def host_ranks(self) -> range:
        return range(self.node_rank * self.local_world, (self.node_rank + 1) * self.local_world)

    @property
    def world_members(self) -> int:
        """Members of this host's step-broadcast group: its ranks, plus the relay
        (index 0) on nodes > 0."""
        return self.local_world + (1 if self.node_rank > 0 else 0)

    def world_index(self, rank: int) -> int:
        return rank - self.host_ranks().start + (1 if self.node_rank > 0 else 0)

    def paths(self) -> list[str]:
        return [p for p in (self.world_path, *self.shm_paths.values()) if p]

    def unlink(self) -> None:
        for p in self.paths():
            unlink_segment(p)


class RankComms:
    """The groups one rank takes part in: shared memory within its host, gloo across."""

    def __init__(self, layout: Layout, rank: int) -> None:
        tp = layout.tp
        self.layout = layout
        self.rank, self.tp_rank, self.pp_rank = rank, rank % tp, rank // tp
        self.world = (ShmGroup(layout.world_path, layout.world_members,
                               layout.world_index(rank), name="world")
                      if layout.world_path else None)
        all_groups = group_ranks(tp, layout.pp)
        #: gloo groups in creation order (every rank creates all of them), None where
        #: this rank is not a member.
        self._gloo: list[tuple[list[int], GlooGroup | None]] = []
        mine: dict[Key, ShmGroup | GlooGroup] = {}
        for key in layout.gloo_keys:
            ranks = all_groups[key]
            group = GlooGroup(ranks, ranks.index(rank), _tag(key)) if rank in ranks else None
            self._gloo.append((ranks, group))
            if group is not None:
                mine[key] = group
        for key, path in layout.shm_paths.items():
            ranks = all_groups[key]
            if rank in ranks:
                mine[key] = ShmGroup(path, len(ranks), ranks.index(rank), name=_tag(key))
        self.tp_group = mine.get(("tp", self.pp_rank)) if tp > 1 else None
        #: other stage -> the pair group linking it with this rank's stage (same TP index).
        self.pairs: dict[int, ShmGroup | GlooGroup] = {}
        for key, group in mine.items():
            if key[0] != "pp":
                continue
            a, b = all_groups[key]
            self.pairs[(b if rank == a else a) // tp] = group

    def connect(self) -> None:
        """Create the gloo groups (after init_gloo; every rank, same order)."""
        from datetime import timedelta

        import torch.distributed as dist

        from glowlm.distributed.gloo import TIMEOUT_SECONDS

        for ranks, group in self._gloo:
            if group is not None:
                group.connect()
            else:
                dist.new_group(ranks, timeout=timedelta(seconds=TIMEOUT_SECONDS))

    def groups(self) -> list[ShmGroup | GlooGroup]:
        out: list[ShmGroup | GlooGroup] = [self.world] if self.world is not None else []
        out += list(self.pairs.values())
        return out + ([self.tp_group] if self.tp_group is not None else [])

    def peer(self, stage: int) -> tuple[Any, int, int]:
        """(group linking this rank to ``stage``'s rank of the same TP index, my index,
        its index)."""
        group = self.pairs[stage]
        return group, group.rank, 1 - group.rank

    def state(self, tp: int, pp: int) -> ParallelState:
        return ParallelState(self.tp_rank, tp, self.pp_rank, pp, self.tp_group)

    def abort(self, reason: str) -> None:
        for g in self.groups():
            g.dead_reason = reason
            g.abort()
