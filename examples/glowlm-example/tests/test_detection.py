"""Detection tested without the hardware: recorded hosts (shipped with glowlm) and
hosts described as data."""

from __future__ import annotations

import pytest
import torch
from glowlm.plugin_api import HostInfo
from glowlm.testing import hosts
from glowlm_example.platform import ExamplePlatform


@pytest.mark.parametrize("name", hosts.names())
def test_matches_every_recorded_host(name: str) -> None:
    host = hosts.load(name)
    match = ExamplePlatform.detect(host)
    assert match.matched and host.machine in match.reason


def test_unknown_architecture_is_a_miss_with_a_reason() -> None:
    match = ExamplePlatform.detect(HostInfo(machine="", system="Linux"))
    assert not match.matched and match.reason == "unknown CPU architecture"


def test_capabilities_name_the_compiled_op_built_at_install() -> None:
    host = hosts.load("x86_64-zen4-epyc-9r14")
    caps = ExamplePlatform.capabilities_for(host, ExamplePlatform.detect(host))
    assert caps.dtypes == (torch.float32, torch.bfloat16) and caps.quantization == ()
    assert caps.kernels == ("glowlm_example::rms_norm",)
