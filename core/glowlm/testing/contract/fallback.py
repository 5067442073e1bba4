"""The contract's check of a compiled-kernel platform whose module cannot load: it still
runs, on core's reference ops, attention and quantized matmuls."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from glowlm.platforms.interface import Platform


def check_reference_fallback(platform: Platform,
                             quantization_configs: Iterable[type[Any]] = ()) -> None:
    """A compiled-kernel platform whose module cannot load in this process (a recorded
    host of another CPU family replayed here, or a failed build) must still run: core's
    reference ops and attention, no kernels listed, a start-up note saying so, and every
    quantization method it declares on core's reference matmuls, never a missing op.

    The plugin's test makes the module unloadable (usually by replaying a recorded host
    of another family as the live CPU) and hands the platform and its
    ``quantization_configs()`` here.
    """
    from glowlm.layers.quantization.kernels import REFERENCE_KERNELS

    assert platform.ops().replaced() == [], platform.ops().replaced()
    assert platform.attention_backend().name == "reference"
    assert platform.capabilities.kernels == ()
    assert any("core's reference ops" in n for n in platform.startup_notes()), \
        platform.startup_notes()
    configs = list(quantization_configs)
    assert {c.name for c in configs} >= set(platform.capabilities.quantization)
    for cls in configs:
        assert cls.supports(platform), cls.name
        config = cls.__new__(cls)
        config.platform = platform
        assert config.kernels() is REFERENCE_KERNELS, cls.name
