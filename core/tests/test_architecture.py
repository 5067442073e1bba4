"""The house keeps its shape: the import graph, drawn from the code, has no circle in
core, the plugins or the kernel package, and core's imports only run down its floors
(:mod:`glowlm.testing.architecture`, docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from glowlm.testing import architecture as arch

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "glowlm"
PACKAGES = sorted(p for p in [*ROOT.glob("plugins/*/glowlm_*"), *ROOT.glob("kernels/glowlm_*"),
                              *ROOT.glob("examples/*/glowlm_*")] if p.is_dir())


@pytest.fixture(scope="module")
def core() -> arch.Graph:
    return arch.build_graph(CORE)


def test_every_core_module_has_a_floor(core: arch.Graph) -> None:
    assert not arch.unplaced(core), (
        "give these modules' folder a floor in glowlm.testing.architecture.FLOORS: "
        + ", ".join(arch.unplaced(core)))


def test_core_has_no_import_circle(core: arch.Graph) -> None:
    found = arch.circles(core)
    assert not found, "import circles in core:\n" + "\n".join(" -> ".join(c) for c in found)


def test_core_imports_only_run_down(core: arch.Graph) -> None:
    up = arch.upward(core)
    assert not up, ("imports from a lower floor to a higher one (move the shared piece down, "
                    "or hand it in from above):\n" + arch.describe(up, ROOT / "core"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_plugin_and_kernel_packages_have_no_import_circle(package: Path) -> None:
    found = arch.circles(arch.build_graph(package))
    assert not found, f"import circles in {package.name}:\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_the_check_sees_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The graph is not vacuous: a circle through a lazy import, one written under
    TYPE_CHECKING and an upward import are each found, with file and line."""
    pkg = tmp_path / "glowlm"
    (pkg / "layers").mkdir(parents=True)
    (pkg / "engine").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "layers" / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "layers" / "a.py").write_text("def f():\n    from glowlm.layers import b\n")
    (pkg / "layers" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from glowlm.layers.a import f\n")
    (pkg / "layers" / "c.py").write_text("from glowlm.engine.d import g\n")
    (pkg / "engine" / "d.py").write_text("g = 1\n")
    graph = arch.build_graph(pkg)
    assert arch.circles(graph) == [["glowlm.layers.a", "glowlm.layers.b"]]
    (up,) = arch.upward(graph)
    assert (up.source, up.target, up.line) == ("glowlm.layers.c", "glowlm.engine.d", 1)
    assert "layers/c.py:1" in arch.describe([up], tmp_path)
