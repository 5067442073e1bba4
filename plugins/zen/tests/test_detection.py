"""Zen detection and dtype rules against recorded hosts (glowlm.testing.hosts).

zentorch cannot be installed here, so hosts say whether it is importable
(``from_dump(..., modules={"zentorch"})``); the linear method's fallback path is
what runs when it is not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from glowlm.plugin_api import HostInfo, from_dump
from glowlm.testing.hosts import HOSTS_DIR
from glowlm_x86.platform import X86Platform
from glowlm_zen.linear import ZentorchLinearMethod
from glowlm_zen.platform import ZenPlatform

HOSTS = HOSTS_DIR  # the recorded hosts glowlm ships (glowlm.testing.hosts)
ZEN4 = "x86_64-zen4-epyc-9r14.cpuinfo"


def host(name: str, *modules: str) -> HostInfo:
    return from_dump(HOSTS / name, frozenset(modules))


def zen(h: HostInfo | None = None) -> ZenPlatform:
    h = h or host(ZEN4, "zentorch")
    match = ZenPlatform.detect(h)
    assert match.matched, match.reason
    return ZenPlatform(h, match)


@pytest.fixture
def glowlm_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """glowlm's logger does not propagate to root; hook pytest's handler onto it."""
    logger = logging.getLogger("glowlm")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_zen_subclasses_the_x86_platform_and_ranks_above_it() -> None:
    assert issubclass(ZenPlatform, X86Platform)
    assert ZenPlatform.rank > X86Platform.rank


def test_zen4_with_zentorch_matches_and_says_so_at_startup() -> None:
    p = zen()
    assert "AuthenticAMD" in p.match.reason and "zentorch" in p.match.reason
    assert "AMD Zen CPU detected with zentorch installed" in p.startup_notes()
    assert p.capabilities.kernels == ("zentorch:linear",)


def test_zen4_without_zentorch_misses_with_the_install_command() -> None:
    match = ZenPlatform.detect(host(ZEN4))
    assert not match.matched
    assert match.reason.startswith("AMD Zen CPU with AVX-512 but zentorch is not installed: "
                                   "pip install glowlm-zen[zentorch]")


@pytest.mark.parametrize("name,fact", [("x86_64-zen3-epyc-milan-live.cpuinfo", "avx512f"),
                                       ("x86_64-icelake-xeon-8375c.cpuinfo", "AuthenticAMD"),
                                       ("x86_64-ivybridge-xeon-e5-2670v2.cpuinfo", "avx2"),
                                       ("aarch64-graviton3-neoverse-v1.cpuinfo", "x86_64")])
def test_misses_name_the_deciding_fact_even_with_zentorch(name: str, fact: str) -> None:
    match = ZenPlatform.detect(host(name, "zentorch"))
    assert not match.matched and fact in match.reason


def test_zentorch_is_probed_last() -> None:
    # An Intel host must never import zentorch just to be told "not AMD".
    class Probe(HostInfo):
        def has_module(self, name: str) -> bool:
            raise AssertionError(f"probed {name}")

    intel = host("x86_64-icelake-xeon-8375c.cpuinfo")
    probe = Probe(**{f: getattr(intel, f) for f in intel.__dataclass_fields__})
    assert not ZenPlatform.detect(probe).matched


def test_only_bfloat16_and_float32() -> None:
    assert zen().capabilities.dtypes == (torch.bfloat16, torch.float32)


@pytest.mark.parametrize("model_dtype,requested", [(torch.float16, None),
                                                   (torch.float32, "float16"),
                                                   (torch.float16, "auto")])
def test_float16_is_down_cast_to_bfloat16_with_a_log_line(
        model_dtype: torch.dtype, requested: str | None,
        glowlm_logs: pytest.LogCaptureFixture) -> None:
    assert zen().resolve_dtype(model_dtype, requested) == torch.bfloat16
    assert "float16 is not supported by ZenDNN; down-casting to bfloat16" in glowlm_logs.text


def test_other_dtypes_pass_through() -> None:
    p = zen()
    assert p.resolve_dtype(torch.float32, None) == torch.float32
    assert p.resolve_dtype(torch.float16, "bfloat16") == torch.bfloat16


@pytest.mark.parametrize("value,on", [("1", True), ("0", False)])
def test_weight_prepack_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                value: str, on: bool) -> None:
    monkeypatch.setenv("GLOWLM_ZENTORCH_WEIGHT_PREPACK", value)
    p = zen()
    assert p.weight_prepack is on
    assert f"GLOWLM_ZENTORCH_WEIGHT_PREPACK={value}" in " ".join(p.startup_notes())
    assert p.unquantized_linear_method().prepack is on


def test_linear_method_falls_back_to_torch_without_zentorch(
        glowlm_logs: pytest.LogCaptureFixture) -> None:
    try:
        import zentorch  # noqa: F401
        pytest.skip("zentorch is installed: the fallback path is not taken")
    except ImportError:
        pass
    method = ZentorchLinearMethod(prepack=True)
    layer = torch.nn.Module()
    method.create_weights(layer, 8, [4, 2], torch.float32)
    torch.nn.init.normal_(layer.weight)
    method.process_weights_after_loading(layer)
    x = torch.randn(3, 8)
    torch.testing.assert_close(method.apply(layer, x, None), x @ layer.weight.T)
    assert "zentorch_linear_unary" in glowlm_logs.text
