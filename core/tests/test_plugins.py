"""Plugin discovery: entry points, blocking by name, and failures that are never silent.

Plugins here are real modules written to a temporary directory and announced by
in-process entry points (``glowlm.plugins.manager._entry_points`` patched to
return :class:`importlib.metadata.EntryPoint` objects): the one fake we allow.
tests/test_third_party_plugin.py covers a real installed distribution.
"""

from __future__ import annotations

import logging
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import pytest
from glowlm.platforms.host import HostInfo
from glowlm.platforms.selection import choose, gather_candidates
from glowlm.plugins import manager
from glowlm.plugins.manager import ENTRY_POINT_GROUP, load_plugins

HOST = HostInfo(machine="x86_64", system="Linux", flags=frozenset({"avx2"}))

PLATFORM = '''
import torch
from glowlm.platforms.interface import Capabilities, Match, Platform
from glowlm.plugins.hookspecs import hookimpl


class P(Platform):
    name = {name!r}
    rank = {rank}

    @classmethod
    def detect(cls, host):
        {detect}

    @classmethod
    def capabilities_for(cls, host, match):
        return Capabilities(isa="test", dtypes=(torch.float32,))


@hookimpl
def glowlm_platforms():
    return [P]
'''


def platform_module(name: str, rank: int, detect: str = "return Match(True, 'ok')") -> str:
    return PLATFORM.format(name=name, rank=rank, detect=detect)


Install = Callable[..., None]


@pytest.fixture
def install_plugins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Install]:
    """``install_plugins(name=source, ...)``: each becomes module ``fakeplug_<name>``,
    announced by an entry point called ``name``; nothing else is discovered."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def install(**plugins: str) -> None:
        eps = []
        for name, source in plugins.items():
            module = f"fakeplug_{name}"
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            written.append(module)
            eps.append(metadata.EntryPoint(name=name, value=module, group=ENTRY_POINT_GROUP))
        monkeypatch.setattr(manager, "_entry_points", lambda: sorted(eps, key=lambda e: e.name))

    yield install
    for module in written:
        sys.modules.pop(module, None)


@pytest.fixture
def glowlm_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """glowlm's logger does not propagate to root; hook pytest's handler onto it."""
    logger = logging.getLogger("glowlm")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_every_plugin_is_discovered_and_ranked(install_plugins: Install) -> None:
    install_plugins(low=platform_module("low", 0), high=platform_module("high", 200),
                    mid=platform_module("mid", 100))
    cands = gather_candidates(load_plugins(), HOST)
    assert [c.name for c in cands] == ["high", "mid", "low"]
    assert choose(cands, HOST).platform.name == "high"


def test_a_blocked_plugin_is_never_imported_and_is_listed_as_blocked(
        install_plugins: Install) -> None:
    install_plugins(keep=platform_module("keep", 0), tracked=platform_module("tracked", 100))
    plugins = load_plugins(frozenset({"tracked"}))
    assert "fakeplug_tracked" not in sys.modules
    assert "fakeplug_keep" in sys.modules
    cands = gather_candidates(plugins, HOST)
    blocked = next(c for c in cands if c.name == "tracked")
    assert not blocked.matched and blocked.reason == "blocked by GLOWLM_PLUGINS_BLOCK"
    assert choose(cands, HOST).platform.name == "keep"


def test_blocking_through_the_environment(install_plugins: Install,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm import envs
    from glowlm.platforms.selection import select_platform

    install_plugins(keep=platform_module("keep", 0), tracked=platform_module("tracked", 100))
    monkeypatch.setenv("GLOWLM_PLUGINS_BLOCK", " Tracked , other")
    sel = select_platform(HOST, block=envs.get().plugins_block)
    assert sel.platform.name == "keep" and "fakeplug_tracked" not in sys.modules


def test_a_plugin_that_fails_to_import_is_a_warning_and_a_candidate(
        install_plugins: Install, glowlm_logs: pytest.LogCaptureFixture) -> None:
    install_plugins(good=platform_module("good", 0),
                    broken="import glowlm_this_dependency_is_missing\n")
    cands = gather_candidates(load_plugins(), HOST)
    broken = next(c for c in cands if c.name == "broken")
    assert not broken.matched and broken.cls is None
    assert "import failed: ModuleNotFoundError" in broken.reason
    assert re.search(r"plugin 'broken'.*import failed", glowlm_logs.text)
    assert choose(cands, HOST).platform.name == "good"


def test_a_hook_returning_a_non_platform_is_a_warning_naming_the_plugin(
        install_plugins: Install, glowlm_logs: pytest.LogCaptureFixture) -> None:
    install_plugins(good=platform_module("good", 0), odd="""
        from glowlm.plugins.hookspecs import hookimpl

        @hookimpl
        def glowlm_platforms():
            return ["not a class"]
    """)
    cands = gather_candidates(load_plugins(), HOST)
    odd = next(c for c in cands if c.name == "odd")
    assert not odd.matched and "not a Platform subclass" in odd.reason
    assert "plugin 'odd'" in glowlm_logs.text


def test_a_hook_that_raises_is_reported(install_plugins: Install,
                                        glowlm_logs: pytest.LogCaptureFixture) -> None:
    install_plugins(good=platform_module("good", 0), boom="""
        from glowlm.plugins.hookspecs import hookimpl

        @hookimpl
        def glowlm_platforms():
            raise RuntimeError("kaput")
    """)
    boom = next(c for c in gather_candidates(load_plugins(), HOST) if c.name == "boom")
    assert "RuntimeError: kaput" in boom.reason
    assert "plugin 'boom'" in glowlm_logs.text


def test_a_hook_with_a_wrong_signature_is_rejected_at_registration(
        install_plugins: Install, glowlm_logs: pytest.LogCaptureFixture) -> None:
    install_plugins(good=platform_module("good", 0), badsig="""
        from glowlm.plugins.hookspecs import hookimpl

        @hookimpl
        def glowlm_platforms(host):
            return []
    """)
    bad = next(c for c in gather_candidates(load_plugins(), HOST) if c.name == "badsig")
    assert "invalid hooks" in bad.reason and "host" in bad.reason
    assert "plugin 'badsig'" in glowlm_logs.text


def test_a_detector_that_raises_is_a_miss_not_a_crash(
        install_plugins: Install, glowlm_logs: pytest.LogCaptureFixture) -> None:
    install_plugins(good=platform_module("good", 0),
                    flaky=platform_module("flaky", 100, detect="raise KeyError('flags')"))
    cands = gather_candidates(load_plugins(), HOST)
    flaky = next(c for c in cands if c.name == "flaky")
    assert not flaky.matched and "detector raised KeyError" in flaky.reason
    assert choose(cands, HOST).platform.name == "good"
    assert "plugin 'flaky'" in glowlm_logs.text


def test_a_platform_without_a_lower_case_name_is_rejected(install_plugins: Install) -> None:
    install_plugins(shouty=platform_module("Shouty", 100), good=platform_module("good", 0))
    shouty = next(c for c in gather_candidates(load_plugins(), HOST) if c.plugin == "shouty")
    assert "lower-case name" in shouty.reason


def test_core_generic_platform_comes_through_the_same_entry_point_group() -> None:
    eps = {ep.name: ep for ep in manager._entry_points()}
    assert eps["generic"].value == "glowlm.platforms.generic"
    assert eps["generic"].dist is not None and eps["generic"].dist.name == "glowlm"


def test_core_never_imports_a_plugin_by_name() -> None:
    core = Path(__file__).resolve().parents[1] / "glowlm"
    offenders = [
        f"{path.relative_to(core)}: {line.strip()}"
        for path in core.rglob("*.py")
        for line in path.read_text().splitlines()
        if re.match(r"\s*(from|import)\s+glowlm_\w+", line)
    ]
    assert offenders == []
