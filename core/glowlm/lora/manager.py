"""The driver's adapters: known ones, the ones in a slot, the ones the batch pins.

An adapter is *registered* (``--lora-modules``, ``/v1/load_lora_adapter``, or the first
request that names a new :class:`LoRARequest`): read from disk and checked against the
model then, so a broken adapter is refused before any request waits on it. It takes
one of the ``--max-loras`` slots when the scheduler admits a request for it
(:meth:`LoRAManager.admit`); a slot whose adapter no running sequence uses is reused,
least recently used first. So at most ``--max-loras`` adapters run in one batch, and a
request for an adapter that finds every slot pinned waits in the queue.

Unregistering (``/v1/unload_lora_adapter``) hides the name at once; requests already
queued or running on it finish, and its slot is freed with the last of them.

Other ranks of a TP/PP group load the same adapter from the same path: every slot
change is queued in :meth:`LoRAManager.take_loads` and travels with the next step's
inputs (:class:`glowlm.engine.model_runner.StepInputs`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable

from torch import nn

from glowlm.errors import LoRAError
from glowlm.logger import init_logger
from glowlm.lora.adapter import read_adapter
from glowlm.lora.request import LoRARequest
from glowlm.lora.slots import adapted_layers, load_slot, resolve
from glowlm.lora.weights import LoRAPair

logger = init_logger(__name__)

#: (slot, adapter path or None to clear the slot)
SlotLoad = tuple[int, str | None]


def load_from_path(model: nn.Module, layers: dict[str, nn.Module], slot: int,
                   path: str | None, max_rank: int) -> None:
    """A non-driver rank's side of a slot change (the driver checked the adapter)."""
    pieces = None if path is None else resolve(model, read_adapter(path), max_rank, layers,
                                               partial=True)
    load_slot(layers, slot, pieces)


class LoRAManager:
    def __init__(self, model: nn.Module, max_loras: int, max_rank: int,
                 partial: bool = False) -> None:
        self.model = model
        self.layers = adapted_layers(model)
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._partial = partial
        self._by_name: dict[str, LoRARequest] = {}
        self._pieces: dict[int, dict[str, list[tuple[int, LoRAPair]]]] = {}
        self._requests: dict[int, LoRARequest] = {}
        self._owner: list[int | None] = [None] * max_loras
        self._used_at: list[int] = [0] * max_loras
        self._clock = itertools.count(1)
        self._users: Counter[int] = Counter()
        self._pending: list[SlotLoad] = []
        self._ids = itertools.count(1 << 30)

    # -- registry -----------------------------------------------------------------------

    def names(self) -> list[LoRARequest]:
        """The adapters a client may name, in registration order."""
        return list(self._by_name.values())

    def get(self, name: str) -> LoRARequest | None:
        return self._by_name.get(name)

    def new_id(self) -> int:
        """An id for an adapter registered by name and path only (the server's)."""
        taken = set(self._requests)
        return next(i for i in self._ids if i not in taken)

    def register(self, request: LoRARequest) -> bool:
        """Read and check ``request``'s adapter; False if that adapter is already known.
        Raises LoRAError (nothing registered) if it cannot be served."""
        known = self._requests.get(request.lora_int_id)
        if known is not None:
            if known.lora_path != request.lora_path:
                raise LoRAError(f"LoRA id {request.lora_int_id} is already adapter "
                                f"{known.lora_name!r} at {known.lora_path!r}, not "
                                f"{request.lora_path!r}")
            self._by_name.setdefault(request.lora_name, known)
            return False
        if request.lora_name in self._by_name:
            raise LoRAError(f"a LoRA adapter named {request.lora_name!r} is already loaded")
        adapter = read_adapter(request.lora_path)
        self._pieces[request.lora_int_id] = resolve(self.model, adapter, self.max_rank,
                                                    self.layers, partial=self._partial)
        self._requests[request.lora_int_id] = request
        self._by_name[request.lora_name] = request
        logger.info("LoRA adapter %r loaded from %s (rank %d, %d modules)",
                    request.lora_name, request.lora_path, adapter.rank, len(adapter.modules))
        return True

    def unregister(self, name: str) -> None:
        """Hide ``name``; its slot and weights go when no request uses it."""
        request = self._by_name.pop(name, None)
        if request is None:
            raise LoRAError(f"no LoRA adapter named {name!r} is loaded")
        if request not in self._by_name.values():
            self._drop_if_unused(request.lora_int_id)

    def _drop_if_unused(self, lora_id: int) -> None:
        request = self._requests.get(lora_id)
        if request is None or self._users[lora_id] or request in self._by_name.values():
            return
        del self._requests[lora_id]
        self._pieces.pop(lora_id, None)
        for slot, owner in enumerate(self._owner):
            if owner == lora_id:
                self._owner[slot] = None
                load_slot(self.layers, slot, None)
                self._pending.append((slot, None))
        logger.info("LoRA adapter %r unloaded", request.lora_name)

    # -- requests -----------------------------------------------------------------------

    def started(self, lora_id: int) -> None:
        self._users[lora_id] += 1

    def finished(self, lora_id: int) -> None:
        self._users[lora_id] -= 1
        if self._users[lora_id] <= 0:
            del self._users[lora_id]
            self._drop_if_unused(lora_id)

    def slot(self, lora_id: int) -> int:
        """The slot ``lora_id`` sits in (it was admitted)."""
        return self._owner.index(lora_id)

    def admit(self, lora_id: int, running: Iterable[int]) -> bool:
        """Whether a sequence on ``lora_id`` may join the batch beside sequences on the
        adapters ``running``; puts the adapter in a slot if it is not in one."""
        if lora_id in self._owner:
            self._used_at[self._owner.index(lora_id)] = next(self._clock)
            return True
        pinned = set(running)
        free = [s for s, owner in enumerate(self._owner) if owner is None or owner not in pinned]
        if not free:
            return False
        slot = min(free, key=lambda s: (self._owner[s] is not None, self._used_at[s]))
        load_slot(self.layers, slot, self._pieces[lora_id])
        self._owner[slot] = lora_id
        self._used_at[slot] = next(self._clock)
        self._pending.append((slot, self._requests[lora_id].lora_path))
        return True

    def take_loads(self) -> list[SlotLoad]:
        """Slot changes since the last step, for the other ranks."""
        loads, self._pending = self._pending, []
        return loads
