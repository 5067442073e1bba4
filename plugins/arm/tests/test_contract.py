"""glowlm's shipped contract suite (glowlm.testing.contract) with the arm platform: every
op it replaces, its attention backend and linear method, and a tiny Llama and OPT end
to end, for every dtype it advertises, against core's references. Runs where the
platform matches this host; elsewhere the parametrization is empty and says why."""

from __future__ import annotations

import pytest
import torch
from glowlm.testing import contract
from glowlm_arm.platform import ArmPlatform

PLATFORM = contract.platform_for(ArmPlatform)


@pytest.mark.skipif(PLATFORM is None, reason="the arm platform does not match this host")
@pytest.mark.parametrize("check, dtype", contract.cases(PLATFORM), ids=contract.case_id)
def test_contract(check: contract.Check, dtype: torch.dtype) -> None:
    assert PLATFORM is not None
    check(PLATFORM, dtype)
