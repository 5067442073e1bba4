"""Capabilities list only what runs: every installed platform's advertised dtypes run a
tiny model, and every advertised quantization method is implemented by some plugin.

A platform that cannot run on this host is built for a recorded host of its family
(glowlm.testing.hosts); its parts then run here (the Arm, IBM Z and Apple platforms
hand out core's reference parts; x86 caps its kernels by this CPU), so what it
advertises is still exercised. `glowlm platforms` shows exactly these capabilities.
"""

from __future__ import annotations

import pytest
import torch
from glowlm import envs
from glowlm.layers import quantization
from glowlm.platforms.host import live
from glowlm.platforms.interface import Match, Platform
from glowlm.platforms.selection import gather_candidates
from glowlm.plugins.manager import load_plugins
from glowlm.testing import contract, hosts

#: The recorded host (and assumed modules) a platform is built for when it misses here.
RECORDED = {"arm": ("aarch64-graviton3-neoverse-v1", ()), "apple": ("arm64-apple-m2", ()),
            "s390x": ("s390x-z15", ()), "zen": ("x86_64-zen4-epyc-9r14", ("zentorch",)),
            "x86": ("x86_64-icelake-xeon-8375c", ())}


def _platforms() -> list[tuple[str, Platform | None, str]]:
    out = []
    here = live()
    for cand in gather_candidates(load_plugins(envs.get().plugins_block), here):
        if cand.cls is None:
            continue
        host = here if cand.matched else None
        if host is None and cand.name in RECORDED:
            name, modules = RECORDED[cand.name]
            host = hosts.load(name, modules)
        if host is None:
            out.append((cand.name, None, f"{cand.name} matches neither this host nor a "
                                         "recorded one"))
            continue
        match = cand.cls.detect(host)
        assert match.matched, f"{cand.name} on {host.source}: {match.reason}"
        out.append((cand.name, cand.cls(host, Match(True, match.reason, match.isa)), ""))
    return out


PLATFORMS = _platforms()
DTYPE_CASES = [pytest.param(p, d, id=f"{name}-{contract.case_id(d)}")
               for name, p, _ in PLATFORMS if p is not None for d in p.capabilities.dtypes]


def test_every_installed_first_party_platform_is_covered() -> None:
    names = {name for name, p, _ in PLATFORMS if p is not None}
    assert {"generic", "x86", "zen", "arm", "s390x", "apple"} <= names, PLATFORMS


@pytest.mark.parametrize("platform, dtype", DTYPE_CASES)
def test_each_advertised_dtype_runs_a_tiny_model(platform: Platform, dtype: torch.dtype
                                                 ) -> None:
    contract.check_model(platform, dtype)


@pytest.mark.parametrize("platform", [pytest.param(p, id=n) for n, p, _ in PLATFORMS
                                      if p is not None])
def test_each_advertised_quantization_method_is_implemented(platform: Platform) -> None:
    implemented = quantization.registry()
    missing = [m for m in platform.capabilities.quantization if m not in implemented]
    assert not missing, (f"the {platform.name} platform advertises {missing} but no installed "
                         f"plugin implements them (implemented: {sorted(implemented)})")
