"""How a plugin tests its detection: hosts described as data, no hardware needed.

Runs once the plugin is installed (``pip install -e tests/example_plugin``);
tests/test_third_party_plugin.py does that and runs this file.
"""

from __future__ import annotations

import pytest
import torch
from glowlm.platforms.host import HostInfo

platform = pytest.importorskip("glowlm_example.platform")


def test_matches_any_known_architecture() -> None:
    for machine in ("x86_64", "aarch64", "s390x", "ppc64le"):
        match = platform.ExamplePlatform.detect(HostInfo(machine=machine, system="Linux"))
        assert match.matched and machine in match.reason


def test_unknown_architecture_is_a_miss_with_a_reason() -> None:
    match = platform.ExamplePlatform.detect(HostInfo(machine="", system="Linux"))
    assert not match.matched and match.reason


def test_capabilities() -> None:
    host = HostInfo(machine="x86_64", system="Linux")
    cls = platform.ExamplePlatform
    caps = cls.capabilities_for(host, cls.detect(host))
    assert caps.dtypes == (torch.float32, torch.bfloat16) and caps.quantization == ()
