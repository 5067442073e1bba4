"""glowlm-arm's and glowlm-s390x's dense linear method (:mod:`glowlm_kernels.parts`):
the compiled GEMV/GEMM lead its measured-choice candidates, and a platform lists
compiled kernels only where the install built them.

Here over the x86 build of the tree (:mod:`glowlm_kernels.testing`); the engine runs
with the choice on in plugins/arm/tests/test_linear_choice_arm.py (and s390x's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm.plugin_api import UnquantizedLinearMethod
from glowlm_kernels.parts import OP_NAMES, CompiledLinearMethod
from glowlm_kernels.testing import SharedPartsOnX86, shared_parts_on_x86


def _platform() -> SharedPartsOnX86:
    platform, why = shared_parts_on_x86()
    if platform is None:
        pytest.skip(why)
    return platform


def test_the_compiled_gemv_gemm_lead_the_candidates() -> None:
    platform = _platform()
    method = platform.unquantized_linear_method()
    assert isinstance(method, CompiledLinearMethod)
    layer = torch.nn.Linear(64, 32, bias=False)
    candidates = method.linear_candidates(layer)
    names = [c.name for c in candidates]
    assert names[0] == "glowlm" and names[-1] == "torch", names
    first = candidates[0]
    kernels = platform.compiled()
    assert kernels is not None and kernels.library() is not None
    assert first.version.startswith(kernels.library().isa + "-")
    assert not first.fused  # no fused decoder ops on these platforms
    x = torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(first.apply(layer, x, None), layer(x), atol=1e-5, rtol=1e-5)
    layer.weight = torch.nn.Parameter(layer.weight.detach().double(), requires_grad=False)
    assert not first.supports(layer)  # not a kernel dtype: never offered


def test_core_dense_method_does_not_offer_it() -> None:
    names = [c.name for c in UnquantizedLinearMethod().linear_candidates(torch.nn.Linear(8, 8))]
    assert "glowlm" not in names and "torch" in names


def test_capabilities_list_the_kernels_the_install_built(tmp_path: Path) -> None:
    platform = _platform()  # glowlm-x86's package holds built modules
    assert type(platform).built_variants()
    assert type(platform).installed_kernels() == OP_NAMES

    class NoneBuilt(SharedPartsOnX86):
        kernel_package_dir = tmp_path

    assert NoneBuilt.built_variants() == () and NoneBuilt.installed_kernels() == ()
