"""The zentorch linear method and candidate, wherever zentorch imports.

zentorch installs from PyPI on any x86_64 Linux (``pip install zentorch==2.13.0.2``
beside torch 2.13.0); its kernels run on AMD Zen 4/5 (and other AVX-512 CPUs).
Results are held against ``F.linear`` in float32 with the tolerances of each dtype.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

zentorch = pytest.importorskip("zentorch", reason="zentorch is not installed (pip install "
                                                  "glowlm-zen[zentorch])")

from glowlm.layers.linear_choice import choose_for_model, onednn_candidates  # noqa: E402
from glowlm.plugin_api import ModelParts, ReplicatedLinear, from_dump  # noqa: E402
from glowlm.testing.hosts import HOSTS_DIR  # noqa: E402
from glowlm_zen.linear import ZentorchLinearMethod  # noqa: E402
from glowlm_zen.platform import ZenPlatform  # noqa: E402

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


def layer(method: ZentorchLinearMethod, dtype: torch.dtype, bias: bool = True,
          n: int = 256, k: int = 128) -> ReplicatedLinear:
    lin = ReplicatedLinear(k, n, bias, ModelParts(dtype=dtype, unquantized=method), "l")
    g = torch.Generator().manual_seed(0)
    lin.weight.data.copy_(torch.randn(n, k, generator=g))
    if bias:
        lin.bias.data.copy_(torch.randn(n, generator=g))
    method.process_weights_after_loading(lin)
    return lin


def reference(lin: ReplicatedLinear, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    b = None if lin.bias is None else lin.bias.float()
    return F.linear(x.float(), weight.float(), b)


def close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    err = float((y.float() - ref).norm() / ref.norm())
    assert err < TOL[dtype], err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prepack", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 32, 300])
def test_loaded_layers_match_f_linear(dtype: torch.dtype, prepack: bool, rows: int) -> None:
    method = ZentorchLinearMethod(prepack=prepack)
    plain = torch.randn(256, 128, generator=torch.Generator().manual_seed(0)).to(dtype)
    lin = layer(method, dtype)
    assert lin.zentorch_prepacked is prepack and lin.zentorch_transposed is not prepack
    x = torch.randn(rows, 128).to(dtype)
    close(lin(x), reference(lin, x, plain), dtype)


#: oneDNN on a packed weight, where this torch has it (every x86_64 build).
ONEDNN = [c.name for c in onednn_candidates()]


def test_an_unpacked_row_major_weight_is_never_handed_to_zentorch() -> None:
    """zentorch 2.13 reads an unpacked weight as [in, out] memory at most shapes (not at
    48 x 64): the bug the layout conversion exists for. If this starts failing,
    zentorch fixed it."""
    w = torch.randn(256, 128)
    x = torch.randn(5, 128)
    wrong = torch.ops.zentorch.zentorch_linear_unary(x, w, None)
    right = torch.ops.zentorch.zentorch_linear_unary(x, w.t().contiguous().t(), None)
    torch.testing.assert_close(right, F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert not torch.allclose(wrong, F.linear(x, w), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_measured_choice_keeps_plain_weights_and_times_zentorch_on_a_copy(
        dtype: torch.dtype, tmp_path: Path) -> None:
    method = ZentorchLinearMethod(prepack=True, measured=True)
    lin = layer(method, dtype)
    plain = lin.weight.detach().clone()
    assert not lin.zentorch_prepacked               # loading left the weight plain
    names = [c.name for c in method.linear_candidates(lin)]
    assert names == ["zentorch", *ONEDNN, "torch"]
    model = torch.nn.ModuleList([lin])
    plan = choose_for_model(model, dtype, None, None, show_progress=False,
                            environ={"GLOWLM_LINEAR_CHOICE_CACHE": str(tmp_path)})
    # Neither candidate was skipped as wrong: zentorch's copy gives the right numbers.
    for classes in plan.shapes.values():
        for m in classes.values():
            assert all(t is not None for t in m.us.values()), m.us
    x = torch.randn(40, 128).to(dtype)
    close(lin(x), reference(lin, x, plain), dtype)
    used = {c.name for _, c in lin.method.impls}
    if used == {"zentorch"}:
        assert lin.zentorch_prepacked and not hasattr(lin, "zentorch_weight")
    elif "zentorch" not in used:
        assert not hasattr(lin, "zentorch_weight")   # the measuring copy was dropped
    else:
        assert hasattr(lin, "zentorch_weight")      # mixed: the copy stays beside


def test_pinning_zentorch_prepacks_in_place(tmp_path: Path) -> None:
    method = ZentorchLinearMethod(prepack=True, measured=True)
    lin = layer(method, torch.bfloat16)
    plain = lin.weight.detach().clone()
    choose_for_model(torch.nn.ModuleList([lin]), torch.bfloat16, None, None,
                     show_progress=False, environ={"GLOWLM_LINEAR_IMPL": "zentorch",
                                                   "GLOWLM_LINEAR_CHOICE_CACHE": str(tmp_path)})
    assert lin.zentorch_prepacked and not hasattr(lin, "zentorch_weight")
    x = torch.randn(3, 128).to(torch.bfloat16)
    close(lin(x), reference(lin, x, plain), torch.bfloat16)


def test_the_zen_platform_offers_zentorch_glowlm_and_torch(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    h = from_dump(HOSTS / "x86_64-zen4-epyc-9r14.cpuinfo", frozenset({"zentorch"}))
    platform = ZenPlatform(h, ZenPlatform.detect(h))
    method = platform.unquantized_linear_method()
    lin = layer(method, torch.bfloat16)
    names = [c.name for c in method.linear_candidates(lin)]
    if platform.kernels() is None:
        assert names == ["zentorch", *ONEDNN, "torch"]
    else:
        from glowlm_x86.kernels.linear import packed_available

        # The block-packed GEMM joins where the loaded build has it (every current one).
        packed = ["glowlm-packed"] if packed_available() else []
        assert names == ["zentorch", "glowlm", *packed, *ONEDNN, "torch"]
        assert method.runs_fused_kernels
    monkeypatch.setenv("GLOWLM_LINEAR_IMPL", "default")
    old = platform.unquantized_linear_method()
    assert not old.measured and not getattr(old, "runs_fused_kernels", False)
