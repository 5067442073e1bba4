"""glowlm's contract suite, run with this plugin's platform: every op it replaces, the
attention backend and linear method it hands out, and a tiny Llama and OPT end to end,
for every dtype it advertises, against core's references. Nothing here is specific to
the example: copy this file as it is and change the import."""

from __future__ import annotations

import pytest
import torch
from glowlm.testing import contract
from glowlm_example.platform import ExamplePlatform

PLATFORM = contract.platform_for(ExamplePlatform)


def test_the_platform_runs_here_and_uses_its_compiled_op() -> None:
    assert PLATFORM is not None
    assert PLATFORM.ops().replaced() == ["rms_norm", "fused_add_rms_norm"]


@pytest.mark.skipif(PLATFORM is None, reason="the example platform does not match this host")
@pytest.mark.parametrize("check, dtype", contract.cases(PLATFORM), ids=contract.case_id)
def test_contract(check: contract.Check, dtype: torch.dtype) -> None:
    assert PLATFORM is not None
    check(PLATFORM, dtype)
