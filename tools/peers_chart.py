"""The chart of a ``tools/bench_peers.py`` report: one panel per figure, one bar per engine.

Runs as a script (``python peers_chart.py REPORT.json OUT.png``) with any Python that has
matplotlib (glowlm's venv need not: ``tools/bench_peers.py`` falls back to the vLLM
peer's venv), so it imports nothing from glowlm. Every panel says whether higher or
lower is better, and the title carries the host's CPU and flags, since a figure
without its host says nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ENGINES = ("glowlm", "vllm", "llama.cpp", "transformers")
COLORS = {"glowlm": "#d95f02", "vllm": "#1b9e77", "llama.cpp": "#7570b3",
          "transformers": "#888888"}
FIGURES = (("ttft_ms", "P1 TTFT (ms, lower is better)"),
           ("decode_tokens_per_s", "P1 decode (tok/s, higher is better)"),
           ("output_tokens_per_s", "P2 output (tok/s, higher is better)"),
           ("p3_output_tokens_per_s", "P3 serving output (tok/s, higher is better)"),
           ("p3_median_ttft_ms", "P3 median TTFT (ms, lower is better)"),
           ("p3_median_tpot_ms", "P3 median TPOT (ms, lower is better)"))


def draw(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = [(k, label) for k, label in FIGURES
               if any(e.get(k) is not None for r in report["results"]
                      for e in r["engines"].values())]
    dtypes = [r["dtype"] for r in report["results"]]
    cols = min(3, max(1, len(figures)))
    rows = (len(figures) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    engines = [e for e in ENGINES if any(e in r["engines"] for r in report["results"])]
    width = 0.8 / max(1, len(engines))
    for ax, (key, label) in zip(axes.flat, figures, strict=False):
        for i, engine in enumerate(engines):
            values = [r["engines"].get(engine, {}).get(key) for r in report["results"]]
            xs = [d + (i - (len(engines) - 1) / 2) * width for d in range(len(dtypes))]
            bars = ax.bar([x for x, v in zip(xs, values, strict=True) if v is not None],
                          [v for v in values if v is not None], width,
                          label=engine, color=COLORS[engine])
            ax.bar_label(bars, fmt="%.0f" if "ms" in key else "%.1f", fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.set_xticks(range(len(dtypes)), dtypes)
    for ax in list(axes.flat)[len(figures):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    host = report["host"]
    fig.suptitle(f"{Path(report['model']).name}, {report['threads']} threads - {host['cpu']}\n"
                 f"flags: {' '.join(host['flags_that_matter'])} - {report['started']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: peers_chart.py REPORT.json OUT.png", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed in this Python", file=sys.stderr)
        return 1
    draw(json.loads(Path(argv[0]).read_text()), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
