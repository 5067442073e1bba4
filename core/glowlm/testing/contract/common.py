"""What every check of the contract suite shares: the tolerances (why they are what
they are: the package's docstring), the check's signature, seeded tensors, and the
comparison that says what differed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from glowlm.platforms.interface import Platform

TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}
GEMM_TOL: dict[torch.dtype, dict[str, float]] = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
}

Check = Callable[[Platform, torch.dtype], None]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed)).to(dtype)


def close(got: Any, want: Any, tol: dict[str, float], what: str) -> None:
    try:
        torch.testing.assert_close(got, want, **tol)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None
