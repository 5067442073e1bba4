"""Plugin-owned settings: each plugin declares its environment variables, core's envs.py
holds core's alone, and the docs table and collect-env list every installed plugin's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from glowlm import envs
from glowlm.plugins.manager import load_plugins

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
#: The checks of the Zen plugin's setting need it installed (not on the Arm/macOS jobs).
needs_zen = pytest.mark.skipif(importlib.util.find_spec("glowlm_zen") is None,
                               reason="glowlm-zen is not installed")


def _plugin_settings() -> list[tuple[str, envs.Setting]]:
    return [(o, s) for o, s in load_plugins().settings() if o != "glowlm"]


@needs_zen
def test_in_tree_plugins_declare_their_settings_and_core_holds_none_of_them() -> None:
    owners = {s.name: o for o, s in _plugin_settings()}
    assert owners.get("GLOWLM_ZENTORCH_WEIGHT_PREPACK") == "zen"
    assert "GLOWLM_ZENTORCH_WEIGHT_PREPACK" not in envs.DOCUMENTED
    assert not hasattr(envs.parse({}), "zentorch_weight_prepack")
    plugins = load_plugins()
    assert all(p.error is None for p in plugins.plugins), [
        (p.name, p.error) for p in plugins.plugins if p.error]


@pytest.mark.parametrize("owner, setting", _plugin_settings(), ids=lambda v: getattr(v, "name", v))
def test_every_installed_plugin_setting_has_a_row_in_the_docs(owner: str,
                                                              setting: envs.Setting) -> None:
    rows = [line for line in DOCS.read_text().splitlines()
            if line.startswith(f"| `{owner}` | `{setting.name}` |")]
    assert rows, f"docs/configuration.md has no plugin-settings row for {owner} {setting.name}"


@needs_zen
def test_collect_env_lists_plugin_settings_with_their_owner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.entrypoints.cli.collect_env import EnvContext, settings_section

    monkeypatch.setenv("GLOWLM_ZENTORCH_WEIGHT_PREPACK", "0")
    title, values = settings_section(EnvContext())
    assert title == "settings"
    assert values["GLOWLM_ZENTORCH_WEIGHT_PREPACK"] == "'0' [zen]"
    assert values["GLOWLM_PLATFORM"].endswith("[glowlm]")


@needs_zen
def test_zen_reads_its_setting_with_the_same_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    from glowlm.errors import ConfigError

    try:  # skipped above where it is not installed
        from glowlm_zen.platform import WEIGHT_PREPACK
    except ImportError:  # pragma: no cover
        pytest.skip("glowlm-zen is not installed")

    assert WEIGHT_PREPACK.get({}) is True
    assert WEIGHT_PREPACK.get({"GLOWLM_ZENTORCH_WEIGHT_PREPACK": "off"}) is False
    with pytest.raises(ConfigError, match="GLOWLM_ZENTORCH_WEIGHT_PREPACK='2' is not a boolean"):
        WEIGHT_PREPACK.get({"GLOWLM_ZENTORCH_WEIGHT_PREPACK": "2"})
