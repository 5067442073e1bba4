"""Draw glowlm's floors and the imports between its packages, from the code.

    python tools/architecture.py [--out docs/architecture.png]

The graph is :mod:`glowlm.testing.architecture`'s (the one ``core/tests/
test_architecture.py`` checks): each floor is a band, bottom to top; each box is one
package (or top-level module) of core, with its module and line counts; each line is
the imports between two packages, drawn from the importer's top edge to the imported
box's bottom edge, thicker for more imports. It prints the same figures as text.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from collections import Counter
from pathlib import Path

from glowlm.testing import architecture as arch

ROOT = Path(__file__).resolve().parents[1]


def group(module: str) -> str:
    """``glowlm.layers.linear`` -> ``layers``; ``glowlm.envs`` -> ``envs``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "glowlm (facade)"


def summarize(graph: arch.Graph) -> tuple[dict[int, list[str]], Counter[str], Counter[str],
                                            Counter[tuple[str, str]]]:
    floors: dict[int, list[str]] = {}
    modules: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for module, path in graph.paths.items():
        g = group(module)
        modules[g] += 1
        lines[g] += len(path.read_text().splitlines())
        f = arch.floor_of(module)
        if g not in floors.setdefault(f, []):
            floors[f].append(g)
    edges: Counter[tuple[str, str]] = Counter()
    for imp in graph.imports:
        a, b = group(imp.source), group(imp.target)
        if a != b:
            edges[(a, b)] += 1
    return floors, modules, lines, edges


def draw(graph: arch.Graph, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    floors, modules, lines, edges = summarize(graph)
    n = len(arch.FLOORS)
    width, row = 16.0, 1.0
    fig, ax = plt.subplots(figsize=(width, n * row * 1.05 + 1.2))
    box_h = 0.46
    where: dict[str, tuple[float, float, float]] = {}  # group -> (x0, x1, y)
    for f, (name, what, _) in enumerate(arch.FLOORS):
        y = f * row
        ax.add_patch(plt.Rectangle((0, y + 0.04), width, row - 0.08,
                                   color="#eef2f7" if f % 2 else "#f8f9fb", zorder=0))
        ax.text(0.12, y + row - 0.22, name, fontsize=11, weight="bold", va="center")
        ax.text(0.12, y + row - 0.38, textwrap.fill(what, 58), fontsize=6.2, va="top",
                color="#555555")
        groups = sorted(floors.get(f, []), key=lambda g: -lines[g])
        x0, span = 4.1, width - 4.3
        total = sum(math.sqrt(lines[g]) for g in groups) or 1.0
        gap = 0.12
        avail = span - gap * max(0, len(groups) - 1)
        x = x0
        for g in groups:
            w = avail * math.sqrt(lines[g]) / total
            yb = y + (row - box_h) / 2
            ax.add_patch(FancyBboxPatch((x, yb), w, box_h, boxstyle="round,pad=0.01",
                                        fc="white", ec="#3b6ea5", lw=1.0, zorder=3))
            label = f"{g}\n{modules[g]} mod, {lines[g]:,} lines"
            ax.text(x + w / 2, yb + box_h / 2, label, ha="center", va="center",
                    fontsize=7 if w > 1.0 else 5.5, zorder=4)
            where[g] = (x, x + w, yb)
            x += w + gap
    most = max(edges.values(), default=1)

    def centre(g: str) -> float:
        return (where[g][0] + where[g][1]) / 2

    # Each line leaves its importer's top edge and reaches the imported box's bottom
    # edge at its own point, ordered by where the other end is, so lines do not bunch.
    outs: dict[str, list[str]] = {}
    ins: dict[str, list[str]] = {}
    for a, b in edges:
        outs.setdefault(a, []).append(b)
        ins.setdefault(b, []).append(a)

    def anchor(g: str, others: list[str], other: str) -> float:
        order = sorted(others, key=centre)
        x0, x1, _ = where[g]
        return x0 + (x1 - x0) * (order.index(other) + 1) / (len(order) + 1)

    for (a, b), count in sorted(edges.items(), key=lambda e: e[1]):
        xa, xb = anchor(a, outs[a], b), anchor(b, ins[b], a)
        ya, yb = where[a][2], where[b][2]
        lw = 0.4 + 1.6 * count / most
        if ya == yb:  # same floor: a low arc under the two boxes
            ax.annotate("", (xb, yb), (xa, ya), zorder=2, arrowprops=dict(
                arrowstyle="-|>", color="#c08a3e", lw=lw, alpha=0.8, shrinkA=0, shrinkB=0,
                connectionstyle="arc3,rad=0.15" if xa < xb else "arc3,rad=-0.15"))
            continue
        ax.annotate("", (xb, yb + box_h), (xa, ya), zorder=2, arrowprops=dict(
            arrowstyle="-|>", color="#6f8299", alpha=0.5, lw=lw, shrinkA=0, shrinkB=0))
    found, up = arch.circles(graph), arch.upward(graph)
    ax.set_title(f"glowlm core: {len(graph.paths)} modules on {n} floors, "
                 f"{len(graph.imports)} imports, {len(found)} circles, {len(up)} upward "
                 "imports (drawn from the code by tools/architecture.py)", fontsize=10)
    ax.set_xlim(0, width)
    ax.set_ylim(0, n * row)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    args = ap.parse_args()
    graph = arch.build_graph(ROOT / "core" / "glowlm")
    floors, modules, lines, _ = summarize(graph)
    for f in range(len(arch.FLOORS) - 1, -1, -1):
        name = arch.FLOORS[f][0]
        row = ", ".join(f"{g} ({modules[g]}, {lines[g]:,} lines)" for g in floors.get(f, []))
        print(f"{name:>12}: {row}")
    found, up = arch.circles(graph), arch.upward(graph)
    print(f"{len(graph.imports)} imports, {len(found)} circles, {len(up)} upward")
    draw(graph, args.out)
    print(f"picture: {args.out}")
    return 1 if found or up else 0


if __name__ == "__main__":
    raise SystemExit(main())
