"""The import graph of glowlm's Python packages, drawn from the code, and its floors.

The house rule (docs/architecture.md): every module of core sits on one *floor*, given
by its folder, and imports only from its own floor or the floors below; no two modules
import each other through any chain (no circle), counting every import — at module
level, inside functions (the lazy ones) and under ``TYPE_CHECKING`` — since each one
is a dependency a reader has to follow. The plugin packages and the kernel package
keep the same rule without floors: no circle (that they import core only through
:mod:`glowlm.plugin_api` is ``core/tests/test_plugin_api.py``'s check).

``core/tests/test_architecture.py`` checks the rule on every run; ``tools/architecture.py``
draws the picture in the docs from the same graph.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: Bottom to top: (floor, what it holds, the module prefixes on it). The longest
#: matching prefix places a module; a module no prefix matches is an error.
FLOORS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("base", "settings, errors, logging: what every module may use",
     ("glowlm.envs", "glowlm.errors", "glowlm.logger", "glowlm.config", "glowlm.version",
      "glowlm.default_model")),
    ("interfaces", "the plugin interfaces (Platform, AttentionBackend, LinearMethod, the op "
     "table), core's reference ops, host facts and process placement",
     ("glowlm.platforms", "glowlm.plugins", "glowlm.attention", "glowlm.ops",
      "glowlm.runtime")),
    ("parallel", "the parallel state and the collectives layers call",
     ("glowlm.distributed",)),
    ("layers", "linear/attention/norm/rotary layers, quantization methods, the measured "
     "linear choice, sampling, LoRA slots", ("glowlm.layers", "glowlm.sampling",
                                             "glowlm.lora.slots", "glowlm.lora.weights",
                                             "glowlm.lora.request")),
    ("models", "the model families, declared on shared decoders", ("glowlm.models",)),
    ("loader", "finding, reading and mapping checkpoints (safetensors, GGUF)",
     ("glowlm.model_loader", "glowlm.lora.adapter")),
    ("engine", "one engine: setup and memory plan, scheduler, block manager, runner",
     ("glowlm.engine", "glowlm.lora")),
    ("ranks", "processes: tensor/pipeline ranks, other hosts, data-parallel engines",
     ("glowlm.executor",)),
    ("entrypoints", "the server, the CLI, the offline API, benchmarks, test helpers, the "
     "plugin API", ("glowlm.entrypoints", "glowlm.bench", "glowlm.testing",
                    "glowlm.plugin_api", "glowlm")),
)

@dataclass(frozen=True)
class Import:
    """One import statement's target inside the package, with where it is written."""

    source: str
    target: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Graph:
    """Modules of one package (dotted names) and the imports between them."""

    root: str
    paths: dict[str, Path] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.paths}
        for imp in self.imports:
            if imp.target != imp.source:
                out[imp.source].add(imp.target)
        return out


def _module_name(base: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(base).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(parts), is_pkg


def _statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def build_graph(package_dir: Path) -> Graph:
    """Every import of ``package_dir`` (a package's folder) resolved to the package's
    own modules: ``from a.b import c`` is an import of ``a.b.c`` where that is a module,
    else of ``a.b``."""
    base = package_dir.parent
    root = package_dir.name
    graph = Graph(root)
    pkg_of: dict[str, bool] = {}
    for path in sorted(package_dir.rglob("*.py")):
        name, is_pkg = _module_name(base, path)
        graph.paths[name] = path
        pkg_of[name] = is_pkg

    def resolve(name: str) -> str | None:
        while name and name not in graph.paths:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in graph.paths.items():
        tree = ast.parse(path.read_text(), str(path))
        here = module.split(".") if pkg_of[module] else module.split(".")[:-1]
        for node in _statements(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    prefix = here[:len(here) - (node.level - 1)]
                    modname = ".".join(prefix + ([node.module] if node.module else []))
                else:
                    modname = node.module or ""
                targets = [f"{modname}.{a.name}" if f"{modname}.{a.name}" in graph.paths
                           else modname for a in node.names]
            for target in targets:
                if target.split(".")[0] == root:
                    hit = resolve(target)
                    if hit is not None:
                        graph.imports.append(Import(module, hit, path, node.lineno))
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (each one a circle
    of imports), members sorted, largest first (Tarjan's algorithm, iterative)."""
    edges = graph.edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found, key=lambda c: (-len(c), c))


def floor_of(module: str) -> int:
    """The floor index of a core module (0 = bottom); KeyError if no floor holds it."""
    best, best_len = -1, -1
    for i, (_, _, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    if best < 0:
        raise KeyError(module)
    return best


def unplaced(graph: Graph) -> list[str]:
    """Modules no floor holds (a new top-level folder must be given a floor)."""
    out = []
    for module in graph.paths:
        try:
            floor_of(module)
        except KeyError:
            out.append(module)
    return out


def upward(graph: Graph) -> list[Import]:
    """Imports from a lower floor to a higher one."""
    return [imp for imp in graph.imports
            if floor_of(imp.target) > floor_of(imp.source)]


def describe(imports: Iterable[Import], base: Path) -> str:
    """One line per import: where it is written, and floor to floor."""
    lines = []
    for imp in imports:
        src = FLOORS[floor_of(imp.source)][0]
        dst = FLOORS[floor_of(imp.target)][0]
        lines.append(f"{imp.path.relative_to(base)}:{imp.line}: {imp.source} ({src}) imports "
                     f"{imp.target} ({dst})")
    return "\n".join(lines)
