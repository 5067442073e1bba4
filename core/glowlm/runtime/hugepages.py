"""Model weights in transparent huge pages (Linux), for decode's read bandwidth.

Decode reads every weight once per token, so it runs at the rate the CPU streams
memory. Reading through 4 KiB pages costs a TLB miss every 4 KiB; with 2 MiB
pages the same read ran 13-15 % faster on Zen 3 (docs/runtime.md). torch
allocates with malloc, which gets huge pages only when THP is ``always``, and most
distributions ship ``madvise``. So after loading, large weights are copied into
one anonymous mapping advised ``MADV_HUGEPAGE`` (one mapping, so no 2 MiB of
rounding per tensor), one tensor at a time so the peak is the model plus one
tensor. ``GLOWLM_NO_HUGE_PAGES=1`` turns it off.

The KV cache comes from the same kind of mapping (:func:`mapped_zeros`): the kernel
hands out zeroed pages on first touch, so a 4 GiB cache costs no 4 GiB memset at
start-up, is resident only as far as it is used, and goes back to the system when
the engine is freed — whatever the allocator keeps for reuse (preload.py tunes
glibc malloc to keep everything it frees) never holds a cache.
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path

import torch
from torch import nn

HUGE_PAGE = 2 << 20
#: Tensors smaller than this stay where they are (norm weights, biases).
MIN_BYTES = 1 << 20
_ALIGN = 4096
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_ENABLED) -> str | None:
    """The bracketed THP mode (``always``, ``madvise``, ``never``); None without THP."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def available() -> bool:
    """Whether advised anonymous mappings can get huge pages here."""
    return hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


def huge_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` starting on a 2 MiB boundary of an advised mapping.

    The tensor keeps the mapping alive; it is unmapped when the last view is freed.
    """
    mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mm, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes]


def mapped_zeros(shape: tuple[int, ...] | list[int], dtype: torch.dtype,
                 huge: bool = True) -> torch.Tensor:
    """A zero tensor in its own anonymous mapping, advised for huge pages if ``huge``.

    Why not ``torch.zeros``: that writes every byte at once and the block then lives
    in the allocator, which may keep it after it is freed (tcmalloc, tuned glibc).
    Here pages are zero-filled by the kernel when first touched and unmapped when the
    last view of the tensor is freed.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    if huge and available():
        return huge_buffer(nbytes).view(dtype).view(shape)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mm, dtype=torch.uint8).view(dtype).view(shape)


def _large_tensors(model: nn.Module) -> list[torch.Tensor]:
    seen: set[int] = set()
    found = []
    for t in list(model.parameters()) + list(model.buffers()):
        if (t.device.type == "cpu" and t.is_contiguous() and t.nbytes >= MIN_BYTES
                and t.data_ptr() not in seen):
            seen.add(t.data_ptr())
            found.append(t)
    return found


def move_weights(model: nn.Module) -> int:
    """Copy the model's large parameters and buffers into huge pages; returns bytes moved.

    Tied parameters are one object (``lm_head.weight is embed.weight``), so moving
    ``.data`` once moves both.
    """
    tensors = _large_tensors(model)
    if not tensors or not available():
        return 0
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.nbytes // _ALIGN) * _ALIGN
    buf = huge_buffer(total)
    for t, off in zip(tensors, offsets, strict=True):
        dst = buf[off:off + t.nbytes].view(t.dtype).view(t.shape)
        dst.copy_(t.data)
        t.data = dst
    return total


def describe(moved: int) -> str:
    """The start-up line: what went into huge pages, or why nothing did."""
    if moved:
        return f"weights in 2 MiB pages: {moved / (1 << 30):.2f} GiB (THP {thp_mode()})"
    mode = thp_mode()
    if mode is None or mode == "never":
        return f"weights in 4 KiB pages (transparent huge pages: {mode or 'unavailable'})"
    return "weights in 4 KiB pages (GLOWLM_NO_HUGE_PAGES=1 or no tensor >= 1 MiB)"
