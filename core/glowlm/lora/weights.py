"""An adapter's weights in memory: each module's low-rank pair, named as the base
checkpoint names its modules (:mod:`glowlm.lora.adapter` reads them from disk,
:mod:`glowlm.lora.slots` writes them into the layers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoRAPair:
    """One module's update ``x @ a.T @ b.T`` (``a``: [r, in], ``b``: [out, r], scaled)."""

    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass
class LoRAAdapter:
    """An adapter read from disk: its modules (checkpoint names) and largest rank."""

    path: str
    modules: dict[str, LoRAPair] = field(default_factory=dict)
    #: ``base_model_name_or_path`` from the PEFT config, if any (for the model card).
    base_model: str | None = None

    @property
    def rank(self) -> int:
        return max((p.rank for p in self.modules.values()), default=0)

    def nbytes(self) -> int:
        return sum((p.a.numel() + p.b.numel()) * p.a.element_size()
                   for p in self.modules.values())
