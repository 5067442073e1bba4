"""glowlm's shipped contract suite (glowlm.testing.contract) with the zen platform: every
op it replaces, its attention backend and linear method, and a tiny Llama and OPT end
to end, for every dtype it advertises, against core's references. Runs where the
platform matches this host; elsewhere the parametrization is empty and says why."""

from __future__ import annotations

import pytest
import torch
from glowlm.testing import contract
from glowlm_zen.platform import ZenPlatform

PLATFORM = contract.platform_for(ZenPlatform)


@pytest.mark.skipif(PLATFORM is None, reason="the zen platform does not match this host")
@pytest.mark.parametrize("check, dtype", contract.cases(PLATFORM), ids=contract.case_id)
def test_contract(check: contract.Check, dtype: torch.dtype) -> None:
    assert PLATFORM is not None
    check(PLATFORM, dtype)
