"""The engine on the IBM Z platform with the measured linear choice on: the compiled
GEMV/GEMM are timed on every dense shape and the LM head and run where chosen
(glowlm.testing.contract.check_linear_choice). Only on an s390x host: elsewhere the
same parts run over the x86 build in plugins/arm/tests/test_linear_choice_arm.py."""

from __future__ import annotations

import pytest
import torch
from glowlm.testing import contract
from glowlm_s390x.platform import S390xPlatform

PLATFORM = contract.platform_for(S390xPlatform)


@pytest.mark.skipif(
    PLATFORM is None,
    reason="the s390x platform does not match this host "
    "(the shared parts run over the x86 build in the Arm plugin's tests)",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_engine_runs_the_chosen_dense_kernel(dtype: torch.dtype) -> None:
    assert PLATFORM is not None
    if PLATFORM.compiled() is None:
        pytest.skip(f"the s390x kernels do not load here ({PLATFORM.kernel_note()})")
    contract.check_linear_choice(PLATFORM, dtype, "glowlm_s390x")
