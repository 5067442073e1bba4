"""Memory planning before loading: weights + KV cache + activations vs what the rank has.

Placeholder plan until the runtime work lands: the KV budget from the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

GIB = 1 << 30


@dataclass
class MemoryPlan:
    kv_cache_bytes: int


def plan_memory(info: Any, dtype: torch.dtype, config: Any, max_model_len: int) -> MemoryPlan:
    gib = config.kv_cache_space_gib if config.kv_cache_space_gib is not None else 4.0
    return MemoryPlan(kv_cache_bytes=int(gib * GIB))
