"""The public plugin API is the only door into core: every in-tree plugin (and the
template in examples/) imports ``glowlm.plugin_api`` and nothing else from core; their
tests and tools (the x86 plugin's are in tools/x86) may also use the test kit
(``glowlm.testing``) and the offline API (``from glowlm import LLM, SamplingParams``).
Each declares the API version it was built for, and every name the API promises exists."""

from __future__ import annotations

import ast
from pathlib import Path

import glowlm.plugin_api as api
import pytest
from glowlm.plugins import manager
from glowlm.plugins.hookspecs import API_ATTRIBUTE, PLUGIN_API_VERSION

ROOT = Path(__file__).resolve().parents[2]
#: Every plugin package (and the shared kernel tree the CPU plugins build on).
PACKAGES = sorted(p for p in [*ROOT.glob("plugins/*/glowlm_*"), *ROOT.glob("examples/*/glowlm_*"),
                              *ROOT.glob("kernels/glowlm_*")] if p.is_dir())
TEST_DIRS = sorted([*ROOT.glob("plugins/*/tests"), *ROOT.glob("plugins/*/tools"),
                    *ROOT.glob("tools/x86"),
                    *ROOT.glob("examples/*/tests"), *ROOT.glob("kernels/tests")])
#: Plugin tests of core's measured linear choice with the plugin's candidates (dense, and
#: the quantized layers' candidates on the plugin's compiled kernels): they test those core
#: modules themselves, so they may import them (and nothing else private).
INTEGRATION = {("plugins/x86/tests/test_linear_choice_x86.py", "glowlm.layers"),
               ("plugins/zen/tests/test_zentorch_linear.py", "glowlm.layers.linear_choice"),
               *(("plugins/x86/tests/test_quant_candidates.py", module) for module in (
                   "glowlm.layers", "glowlm.layers.quantization.candidates",
                   "glowlm.layers.quantization.kernels", "glowlm.layers.quantization.method"))}
PUBLIC = "glowlm.plugin_api"
TEST_KIT = "glowlm.testing"
OFFLINE_API = {"LLM", "SamplingParams", "__version__"}


def core_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every import of a ``glowlm`` (core) module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names
                      if a.name == "glowlm" or a.name.startswith("glowlm.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "glowlm" or node.module.startswith("glowlm.")):
            found.append((node.lineno, node.module, [a.name for a in node.names]))
    return found


def offenders(roots: list[Path], allowed) -> list[str]:  # noqa: ANN001
    return [f"{path.relative_to(ROOT)}:{line}: {module} {names or ''}".rstrip()
            for root in roots for path in sorted(root.rglob("*.py"))
            for line, module, names in core_imports(path)
            if not allowed(module, names)
            and (str(path.relative_to(ROOT)), module) not in INTEGRATION]


def test_the_suite_sees_every_plugin() -> None:
    names = {p.name for p in PACKAGES}
    assert {"glowlm_x86", "glowlm_zen", "glowlm_arm", "glowlm_s390x", "glowlm_apple",
            "glowlm_example"} <= names
    assert all(any(f.exists() for f in ROOT.glob(f"{d}/*.py")) for d in ("plugins/x86/tests",))


def test_plugin_packages_import_only_the_public_api() -> None:
    assert offenders(PACKAGES, lambda module, names: module == PUBLIC) == []


def test_plugin_tests_and_tools_import_only_the_api_the_test_kit_and_the_offline_api() -> None:
    def allowed(module: str, names: list[str]) -> bool:
        return (module == PUBLIC or module == TEST_KIT or module.startswith(TEST_KIT + ".")
                or (module == "glowlm" and bool(names) and set(names) <= OFFLINE_API))

    assert offenders(TEST_DIRS, allowed) == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("from glowlm.platforms.interface import Platform\nimport glowlm.envs\n"
                   "from glowlm.plugin_api import hookimpl\n\n\ndef f():\n"
                   "    from glowlm import envs\n")
    assert [(m, n) for _, m, n in core_imports(bad) if m != PUBLIC] == [
        ("glowlm.platforms.interface", ["Platform"]), ("glowlm.envs", []), ("glowlm", ["envs"])]


@pytest.mark.parametrize("package", [p for p in PACKAGES if (p / "plugin.py").exists()],
                         ids=lambda p: p.name)
def test_every_plugin_declares_the_api_version_it_is_built_for(package: Path) -> None:
    plugin = package / "plugin.py"
    tree = ast.parse(plugin.read_text())
    values = [node.value.value for node in tree.body
              if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
              and any(isinstance(t, ast.Name) and t.id == API_ATTRIBUTE for t in node.targets)]
    assert values == [PLUGIN_API_VERSION], f"{plugin}: {API_ATTRIBUTE} = {values}"


def test_an_undeclared_plugin_is_refused() -> None:
    assert manager.REQUIRE_API_DECLARATION


def test_everything_the_api_lists_exists() -> None:
    assert [n for n in api.__all__ if not hasattr(api, n)] == []
    assert api.PLUGIN_API_VERSION == PLUGIN_API_VERSION
