"""Shared fixtures: tiny seeded checkpoints of every architecture, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.testing.tiny_models import ARCHITECTURES, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """``tiny_model_dir(arch)`` -> path of a seeded tiny checkpoint (cached per session)."""
    cache: dict[str, Path] = {}

    def get(arch: str = "llama") -> Path:
        if arch not in cache:
            cache[arch] = make_tiny_model(arch, tmp_path_factory.mktemp(f"tiny-{arch}"))
        return cache[arch]

    return get


@pytest.fixture(params=ARCHITECTURES)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param
