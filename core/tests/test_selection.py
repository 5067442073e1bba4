"""The selection rules: ranking, ties, forcing, and the explanation users see.

Rules are tested on hand-made candidates (platform classes defined here) so each
rule is isolated from what plugins happen to be installed; the end-to-end path
through entry points is covered by test_plugins.py and test_selection_matrix.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from glowlm.errors import PlatformError
from glowlm.platforms import current_selection, reset_current_platform
from glowlm.platforms.host import HostInfo
from glowlm.platforms.interface import Capabilities, Match, Platform
from glowlm.platforms.selection import Candidate, choose

HOST = HostInfo(machine="x86_64", system="Linux", flags=frozenset({"avx2"}))


def platform_class(name: str, rank: int, matches: bool = True) -> type[Platform]:
    class _P(Platform):
        @classmethod
        def detect(cls, host: HostInfo) -> Match:
            return Match(matches, f"{cls.name} {'matches' if matches else 'needs a unicorn'}",
                         isa="test")

        @classmethod
        def capabilities_for(cls, host: HostInfo, match: Match) -> Capabilities:
            return Capabilities(isa="test", dtypes=(torch.float32,))

    _P.name, _P.rank = name, rank
    return _P


def candidates(*classes: type[Platform]) -> list[Candidate]:
    out = []
    for cls in classes:
        m = cls.detect(HOST)
        out.append(Candidate(name=cls.name, plugin=cls.name, distribution=f"dist-{cls.name}",
                             version="1.0", rank=cls.rank, matched=m.matched, reason=m.reason,
                             cls=cls, isa=m.isa,
                             capabilities=cls.capabilities_for(HOST, m) if m.matched else None))
    return sorted(out, key=lambda c: (-c.rank, c.name))


@pytest.fixture(autouse=True)
def fresh_current_platform() -> Iterator[None]:
    reset_current_platform()
    yield
    reset_current_platform()


def test_highest_matching_rank_wins_and_says_what_it_outranks() -> None:
    sel = choose(candidates(platform_class("low", 0), platform_class("mid", 100),
                            platform_class("top", 300, matches=False)), HOST)
    assert sel.platform.name == "mid"
    assert sel.reason == "mid matches (ranks above low)"


def test_a_vendor_specialisation_outranks_its_family() -> None:
    sel = choose(candidates(platform_class("family", 100), platform_class("vendor", 200)),
                 HOST)
    assert sel.platform.name == "vendor"


def test_equal_top_ranks_are_an_error_naming_both_and_the_way_out() -> None:
    with pytest.raises(PlatformError) as err:
        choose(candidates(platform_class("a", 100), platform_class("b", 100),
                          platform_class("generic", 0)), HOST)
    msg = str(err.value)
    assert "'a'" in msg and "'b'" in msg and "rank 100" in msg
    assert "--platform" in msg and "GLOWLM_PLUGINS_BLOCK" in msg


def test_equal_ranks_below_the_winner_are_fine() -> None:
    sel = choose(candidates(platform_class("a", 50), platform_class("b", 50),
                            platform_class("top", 100)), HOST)
    assert sel.platform.name == "top"


def test_forcing_picks_a_lower_ranked_platform_that_can_run() -> None:
    sel = choose(candidates(platform_class("low", 0), platform_class("top", 200)), HOST,
                 forced="low")
    assert sel.platform.name == "low"
    assert sel.reason.startswith("forced by the user")


def test_forcing_resolves_a_tie() -> None:
    sel = choose(candidates(platform_class("a", 100), platform_class("b", 100)), HOST,
                 forced="b")
    assert sel.platform.name == "b"


def test_forced_platform_that_cannot_run_fails_with_its_reason() -> None:
    with pytest.raises(PlatformError, match="'top' cannot run here: top needs a unicorn"):
        choose(candidates(platform_class("low", 0), platform_class("top", 200, False)), HOST,
               forced="top")


def test_unknown_forced_name_lists_the_valid_ones() -> None:
    with pytest.raises(PlatformError, match="'nope' is not available.*available: low, top"):
        choose(candidates(platform_class("low", 0), platform_class("top", 200)), HOST,
               forced="nope")


def test_forcing_a_blocked_plugin_says_it_is_blocked() -> None:
    blocked = Candidate(name="zen", plugin="zen", distribution="glowlm-zen", version="0.1.0",
                        rank=-1, matched=False, reason="blocked by GLOWLM_PLUGINS_BLOCK")
    with pytest.raises(PlatformError, match="blocked by GLOWLM_PLUGINS_BLOCK"):
        choose([*candidates(platform_class("low", 0)), blocked], HOST, forced="zen")


def test_no_match_at_all_lists_every_reason() -> None:
    with pytest.raises(PlatformError, match="a needs a unicorn; b: b needs a unicorn"):
        choose(candidates(platform_class("a", 1, False), platform_class("b", 0, False)), HOST)


def test_selection_json_has_the_documented_shape() -> None:
    sel = choose(candidates(platform_class("low", 0), platform_class("mid", 100)), HOST)
    out = sel.to_json()
    assert {"name", "isa", "dtypes", "quantization", "reason"} <= set(out["selected"])
    assert out["selected"]["dtypes"] == ["float32"]
    assert [c["name"] for c in out["candidates"]] == ["mid", "low"]
    assert all("reason" in c and "rank" in c and "distribution" in c for c in out["candidates"])


def test_glowlm_platform_env_forces_the_process_platform(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv("GLOWLM_PLATFORM", "generic")
    assert current_selection().platform.name == "generic"


def test_forced_argument_takes_precedence_over_the_env(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.setenv("GLOWLM_PLATFORM", "no-such-platform")
    assert current_selection(forced="generic").platform.name == "generic"


def test_env_forcing_an_unknown_platform_fails_listing_valid_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_PLATFORM", "no-such-platform")
    with pytest.raises(PlatformError, match="available: .*generic"):
        current_selection()
