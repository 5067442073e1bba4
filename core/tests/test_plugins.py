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

GLOWLM_PLUGIN_API = {api}


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


def platform_module(name: str, rank: int, detect: str = "return Match(True, 'ok')",
                    api: str = '"1.0"') -> str:
    """A plugin module with one platform; ``api`` is its GLOWLM_PLUGIN_API expression
    (``None``: no declaration)."""
    source = PLATFORM.format(name=name, rank=rank, detect=detect, api=api)
    return source.replace("GLOWLM_PLUGIN_API = None\n", "") if api == "None" else source


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

        GLOWLM_PLUGIN_API = "1.0"

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

        GLOWLM_PLUGIN_API = "1.0"

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

        GLOWLM_PLUGIN_API = "1.0"

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


def test_a_misspelled_hook_is_an_error_naming_the_plugin_and_the_hook(
        install_plugins: Install, glowlm_logs: pytest.LogCaptureFixture) -> None:
    install_plugins(good=platform_module("good", 0), typo="""
        from glowlm.plugins.hookspecs import hookimpl

        GLOWLM_PLUGIN_API = "1.0"

        @hookimpl
        def glowlm_platfroms():
            return []
    """)
    typo = next(c for c in gather_candidates(load_plugins(), HOST) if c.name == "typo")
    assert not typo.matched
    assert "unknown hook glowlm_platfroms (did you mean glowlm_platforms?)" in typo.reason
    assert "plugin 'typo'" in glowlm_logs.text


def test_an_undecorated_hook_is_an_error_not_a_silent_no_op(install_plugins: Install) -> None:
    install_plugins(good=platform_module("good", 0), bare="""
        GLOWLM_PLUGIN_API = "1.0"

        def glowlm_platforms():
            return []
    """)
    bare = next(c for c in gather_candidates(load_plugins(), HOST) if c.name == "bare")
    assert "glowlm_platforms is not decorated with @hookimpl" in bare.reason


@pytest.mark.parametrize("declared, ok", [("1.0", True), ('"1.0"', True), ("1.1", True),
                                          ("1.2", False), ("2.0", False), ("1.99", False),
                                          ("one", False)])
def test_the_plugin_api_version_is_checked_at_discovery(install_plugins: Install,
                                                        declared: str, ok: bool) -> None:
    from glowlm.plugins.hookspecs import PLUGIN_API_VERSION

    assert PLUGIN_API_VERSION == "1.1"
    value = declared if declared.startswith('"') else repr(declared)
    install_plugins(good=platform_module("good", 0),
                    versioned=platform_module("versioned", 5, api=value))
    cand = next(c for c in gather_candidates(load_plugins(), HOST) if c.plugin == "versioned")
    assert cand.matched is ok
    if declared == "2.0":
        assert cand.reason == (
            "plugin failed: was built for glowlm plugin API 2.0, but this glowlm provides 1.1: "
            "install a release of the plugin built for API 1.x, or a glowlm that provides 2.0")
    elif not ok:
        assert "plugin API" in cand.reason and "\n" not in cand.reason


SETTINGS_PLUGIN = '''
from glowlm.plugin_api import Setting, hookimpl, parse_int

GLOWLM_PLUGIN_API = "1.0"

RANK = Setting("GLOWLM_{tag}_RANK", "7", "rank of the {tag} platform", parse_int)


@hookimpl
def glowlm_settings():
    return [RANK{extra}]
'''


def test_plugins_declare_their_settings_and_a_name_has_one_owner(
        install_plugins: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.errors import ConfigError

    install_plugins(
        alpha=SETTINGS_PLUGIN.format(tag="ALPHA", extra=""),
        beta=SETTINGS_PLUGIN.format(tag="BETA", extra=', Setting("GLOWLM_ALPHA_RANK", "", '
                                    '"dup", str), Setting("NOPREFIX", "", "x", str), 3'))
    plugins = load_plugins()
    settings = {s.name: (owner, s) for owner, s in plugins.settings()}
    assert settings["GLOWLM_ALPHA_RANK"][0] == "alpha"
    assert settings["GLOWLM_BETA_RANK"][0] == "beta"
    assert settings["GLOWLM_PLATFORM"][0] == "glowlm"
    assert "NOPREFIX" not in settings
    beta = plugins.by_name("beta")
    assert beta is not None and beta.error
    monkeypatch.setenv("GLOWLM_ALPHA_RANK", "12")
    assert settings["GLOWLM_ALPHA_RANK"][1].get() == 12
    monkeypatch.setenv("GLOWLM_ALPHA_RANK", "twelve")
    with pytest.raises(ConfigError, match="GLOWLM_ALPHA_RANK='twelve' is not an integer"):
        settings["GLOWLM_ALPHA_RANK"][1].get()


MODELS_PLUGIN = '''
from glowlm.plugin_api import hookimpl

GLOWLM_PLUGIN_API = "1.0"


@hookimpl
def glowlm_models():
    return {models}
'''


def test_a_plugin_adds_a_model_architecture(install_plugins: Install) -> None:
    from glowlm.errors import ModelLoadError, PluginError
    from glowlm.models import registry
    from glowlm.models.llama import LlamaForCausalLM

    install_plugins(fam=MODELS_PLUGIN.format(
        models='{"FamForCausalLM": "glowlm.models.llama:LlamaForCausalLM", '
               '"GoneForCausalLM": "fakeplug_fam_missing:Model"}'))
    plugins = load_plugins()
    assert "FamForCausalLM" in registry.supported_architectures(plugins)
    assert registry.model_class(["FamForCausalLM"], plugins) is LlamaForCausalLM
    with pytest.raises(ModelLoadError, match="'GoneForCausalLM' \\(from 'fam'\\) cannot be "
                                             "imported"):
        registry.model_class(["GoneForCausalLM"], plugins)
    install_plugins(clash=MODELS_PLUGIN.format(
        models='{"LlamaForCausalLM": "glowlm.models.llama:LlamaForCausalLM"}'))
    with pytest.raises(PluginError, match="'LlamaForCausalLM' is provided by both 'glowlm' "
                                          "and plugin 'clash'"):
        registry.model_class(["LlamaForCausalLM"], load_plugins())


def test_register_model_is_open_and_one_owner_per_architecture(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.errors import PluginError
    from glowlm.models import registry
    from glowlm.models.opt import OPTForCausalLM

    monkeypatch.setattr(registry, "_REGISTERED", {})
    registry.register_model("MyOPTForCausalLM", OPTForCausalLM, owner="mine")
    assert registry.model_class(["MyOPTForCausalLM"]) is OPTForCausalLM
    with pytest.raises(PluginError, match="provided by both 'glowlm' and 'mine'"):
        registry.register_model("OPTForCausalLM", OPTForCausalLM, owner="mine")
    with pytest.raises(PluginError, match="provided by both 'mine' and 'yours'"):
        registry.register_model("MyOPTForCausalLM", OPTForCausalLM, owner="yours")


def test_the_block_size_rule_has_one_owner_the_platform_capability(tmp_path: Path) -> None:
    import dataclasses

    from glowlm.config import EngineConfig
    from glowlm.errors import ConfigError
    from glowlm.platforms.generic import GenericCpuPlatform
    from glowlm.platforms.interface import Match

    config = EngineConfig.create(str(tmp_path), block_size=48)  # the config checks only > 0
    with pytest.raises(ConfigError, match="--block-size must be positive"):
        EngineConfig.create(str(tmp_path), block_size=0)
    generic = GenericCpuPlatform(HOST, Match(True, "test"))
    with pytest.raises(ConfigError, match="--block-size 48 must be a multiple of 32 on the "
                                          "generic platform"):
        generic.update_config(config)

    class Sixteen(GenericCpuPlatform):
        @classmethod
        def capabilities_for(cls, host, match):  # noqa: ANN001, ANN206
            return dataclasses.replace(super().capabilities_for(host, match),
                                       block_size_multiple=16)

    assert Sixteen(HOST, Match(True, "test")).update_config(config).block_size == 48


def test_a_plugin_that_declares_no_api_version_is_refused_with_the_fix(
        install_plugins: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "REQUIRE_API_DECLARATION", True)
    install_plugins(good=platform_module("good", 0), old=platform_module("old", 5, api="None"))
    old = next(c for c in gather_candidates(load_plugins(), HOST) if c.plugin == "old")
    assert not old.matched
    assert old.reason == ('plugin failed: declares no plugin API version (set '
                          'GLOWLM_PLUGIN_API = "1.1" in its entry-point module once it is '
                          'built against this API)')
