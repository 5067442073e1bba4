"""The engine on the Arm platform with the measured linear choice on: the compiled
GEMV/GEMM are timed against oneDNN and ``F.linear`` on every dense shape and the LM head,
and run where chosen (glowlm.testing.contract.check_linear_choice).

On an aarch64 host: the Arm platform itself. Elsewhere: the same Python parts over the
x86 build of the kernel tree (glowlm_kernels.testing), which proves the plumbing, not the
NEON arithmetic (the cross contract's) nor which kernel wins on an Arm CPU.
"""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import Platform
from glowlm.testing import contract
from glowlm_arm.platform import ArmPlatform
from glowlm_kernels.testing import shared_parts_on_x86


def _platform() -> tuple[Platform, str]:
    arm = contract.platform_for(ArmPlatform)
    if arm is not None:
        if arm.compiled() is None:
            pytest.skip(f"the Arm kernels do not load here ({arm.kernel_note()})")
        return arm, "glowlm_arm"
    parts, why = shared_parts_on_x86()
    if parts is None:
        pytest.skip(f"not an Arm host, and {why}")
    return parts, "glowlm_x86"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_engine_runs_the_chosen_dense_kernel(dtype: torch.dtype) -> None:
    platform, namespace = _platform()
    if dtype not in platform.capabilities.dtypes:
        pytest.skip(f"{platform.name} ({platform.capabilities.isa}) does not run {dtype}")
    contract.check_linear_choice(platform, dtype, namespace)
