#!/usr/bin/env python3
"""Quantized checkpoints beside bf16, vLLM CPU and llama.cpp: issue #19's bar in one run.

On the llama-1b shape (``make bench-models-quant`` builds every file once into
``.bench_models/``), each engine in its own process, the same protocol and threads as
``tools/bench_peers.py`` (P1: one 128-token prompt, 128 greedy tokens, TTFT and decode
tok/s, one warm-up then the median; P2 with ``--p2``: 32 prompts at once):

=============  ==========================  ===================  ======================
group          glowlm                      vLLM CPU (--vllm)    llama.cpp
=============  ==========================  ===================  ======================
bf16           llama-1b-rand (bf16)        the same directory   llama-1b-rand-bf16.gguf
W4A16 g128     llama-1b-rand-w4a16-g128    the same directory   ...-q4_0.gguf
W8A8           llama-1b-rand-w8a8-dynamic  the same directory   ...-q8_0.gguf
GPTQ / AWQ     ...-gptq-w4a16-g128,        the same directories -
               ...-awq-w4a16-g128-asym
               (each only when it was built)
=============  ==========================  ===================  ======================

The compressed-tensors checkpoints come from llm-compressor
(``tools/make_quant_checkpoints.py --bench``); the GGUFs from llama.cpp's own converter
(bf16, as ``tools/bench_peers.py`` converts) and its quantizer (``llama_model_quantize``,
what ``llama-quantize`` runs: Q4_0 and Q8_0 with llama.cpp's default choice of types per
tensor, recorded in the JSON). Then it prints the table, the ratios the bar names with
their thresholds (W4A16 decode / glowlm bf16 decode >= 2.5, W4A16 / llama.cpp Q4_0 >= 1.0,
W8A8 decode / bf16 >= 1.6, W8A8 TTFT <= bf16 TTFT, each quantized checkpoint / vLLM on
the same checkpoint >= 1.0), the host's CPU model and flags, and writes ``PREFIX.json``
and the chart ``PREFIX.png``. A checkpoint an engine fails on is recorded with its error
line and the run goes on, so one command always gives every figure that can be had.
``--rounds N`` measures every checkpoint on every engine N times, round by round (vLLM
CPU only in the first ``--vllm-rounds``), and keeps the medians: a guest's memory speed
drifts over minutes (bf16 decode 16-25 tok/s on one Zen 4 guest), and a figure taken in
a slow minute beside one taken in a fast minute would move a ratio by 1.5x::

    .venv-peers/bin/python tools/bench_quant_peers.py .bench_models --vllm --rounds 3 \\
        --out benchmark/results/quant-peers/quant_peers        # = make bench-peers-quant
    .venv-peers/bin/python tools/bench_quant_peers.py .bench_models --prepare   # GGUFs only

Run it with the peers venv (``make peers``: llama-cpp-python, and glowlm through
``.venv``); vLLM runs from ``.venv-vllm`` (``make vllm-peer``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "core"))
sys.path.insert(0, str(REPO / "tools"))

import bench_peers  # noqa: E402  (tools/bench_peers.py: conversion, host line, chart)
from glowlm.bench.rounds import merge_rounds  # noqa: E402
from peers_serving import glowlm_env  # noqa: E402

BASE = "llama-1b-rand"
#: group label -> (compressed-tensors scheme suffix or None for the bf16 base, GGUF type)
GROUPS: dict[str, tuple[str | None, str | None]] = {
    "bf16": (None, "bf16"),
    "W4A16 g128": ("w4a16-g128", "q4_0"),
    "W8A8": ("w8a8-dynamic", "q8_0"),
    "W4A16 g128 asym": ("w4a16-g128-asym", None),
    "GPTQ W4A16 g128": ("gptq-w4a16-g128", None),
    "AWQ W4A16 g128": ("awq-w4a16-g128-asym", None),
}
#: Groups that are always measured; the others only when their checkpoint exists.
REQUIRED = ("bf16", "W4A16 g128", "W8A8")
#: llama_ftype of each quantized GGUF (llama.h: LLAMA_FTYPE_MOSTLY_Q4_0 = 2, Q8_0 = 7).
GGUF_FTYPE = {"q4_0": 2, "q8_0": 7}


def progress(message: str) -> None:
    print(f"[bench-quant {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def checkpoint(models: Path, scheme: str | None, base: str = BASE) -> Path:
    return models / (base if scheme is None else f"{base}-{scheme}")


def gguf_path(models: Path, outtype: str, base: str = BASE) -> Path:
    """Where ``tools/bench_peers.py`` keeps its conversions: ``<models>/gguf/``."""
    return models / "gguf" / f"{base}-{outtype}.gguf"


def quantize_gguf(source: Path, out: Path, outtype: str, threads: int) -> Path:
    """``llama-quantize SOURCE OUT Q4_0|Q8_0`` through llama-cpp-python's C API; cached.

    Written to ``OUT.part`` and renamed, so an interrupted run is never taken for a
    finished file.
    """
    if out.is_file():
        return out
    import llamacpp_peer

    llama_cpp = llamacpp_peer.import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = GGUF_FTYPE[outtype]
    params.nthread = threads
    part = out.with_name(out.name + ".part")
    progress(f"quantizing {source.name} -> {out.name} (llama_model_quantize)")
    t = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(part).encode(),
                                        llama_cpp.byref(params))
    if rc != 0:
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize {source} -> {outtype} returned {rc}")
    part.rename(out)
    progress(f"quantized in {time.perf_counter() - t:.0f} s")
    return out


def tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each GGUF type the file holds (llama.cpp keeps norms in F32 and
    picks the output/embedding type itself), so the report says what was measured."""
    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors))


def prepare_ggufs(models: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The bf16 conversion and its Q4_0 / Q8_0 quantizations of the base checkpoint."""
    base = checkpoint(models, None)
    bf16 = gguf_path(models, "bf16")
    if not bf16.is_file():
        script = args.convert_script or bench_peers.find_convert_script()
        if script is None:
            raise SystemExit("no convert_hf_to_gguf.py: run `make peers` or pass "
                             "--convert-script")
        bench_peers.convert(base, "bf16", bf16.parent, script, args.convert_python)
    out = {"bf16": bf16}
    for outtype in GGUF_FTYPE:
        out[outtype] = quantize_gguf(bf16, gguf_path(models, outtype), outtype, args.threads)
    return out


def _error_line(stderr: str) -> str:
    """The line that says why a run failed (the last ``...Error: ...``, else the last)."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line or line.startswith("RuntimeError"):
            return line[:400]
    return lines[-1][:400] if lines else "no output"


def run_json(cmd: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """A measuring subprocess's last JSON line; ``{"error": ...}`` when it fails, so one
    refused checkpoint does not end the run (its stderr tail is kept in the log)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode == 0:
        try:
            result = bench_peers._json_line(proc.stdout)
        except ValueError:
            pass
        else:
            # A kernel that failed to build or load is a warning, not an error: keep them,
            # since such a figure measures the fallback, not the kernel.
            warnings = list(dict.fromkeys(
                line.strip()[:300] for line in proc.stderr.splitlines()
                if line.startswith("WARNING glowlm")))
            return {**result, "warnings": warnings} if warnings else result
    sys.stderr.write(proc.stderr[-3000:])
    error = _error_line(proc.stderr)
    progress(f"{what} failed (exit {proc.returncode}): {error}")
    return {"error": error, "exit_code": proc.returncode}


def glowlm_cmd(args: argparse.Namespace, kind: str, model: Path) -> list[str]:
    cmd = [args.glowlm_bin, "bench", kind, str(model), "--dtype", "bfloat16",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--json"]
    return cmd + (["--num-iters", str(args.num_iters)] if kind == "latency"
                  else ["--num-prompts", str(args.num_prompts)])


def _engine(run: Any, args: argparse.Namespace, what: str) -> dict[str, Any]:
    """P1 then (``--p2``) P2 of one engine on one file; an error stops that engine only."""
    progress(f"{what}: P1")
    out = dict(run("latency"))
    if args.p2 and "error" not in out:
        progress(f"{what}: P2")
        p2 = run("throughput")
        if "error" in p2:
            out["p2_error"] = p2["error"]
        else:
            out.update(output_tokens_per_s=p2["output_tokens_per_s"],
                       total_tokens_per_s=p2.get("total_tokens_per_s"))
    return out


def measure_glowlm(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = glowlm_env(args.threads, args.kv_cache_gib)
    r = _engine(lambda kind: run_json(glowlm_cmd(args, kind, model), env,
                                      f"glowlm {model.name}"), args, f"glowlm {model.name}")
    return {"checkpoint": model.name, **r}


def measure_vllm(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    import vllm_peer

    env = vllm_peer.vllm_env(args.vllm_venv, args.threads, args.kv_cache_gib)

    def run(kind: str) -> dict[str, Any]:
        cmd = vllm_peer.command(args.vllm_venv, kind, model, "bfloat16", args.input_len,
                                args.output_len, args.num_iters, args.num_prompts)
        return run_json(cmd, env, f"vLLM {model.name}")

    return {"checkpoint": model.name, **_engine(run, args, f"vLLM CPU {model.name}")}


def measure_llamacpp(path: Path, vocab: int, args: argparse.Namespace) -> dict[str, Any]:
    import llamacpp_peer

    what = f"llama.cpp {path.name}"
    progress(f"{what}: P1")
    out: dict[str, Any] = {"checkpoint": path.name, "tensor_types": tensor_types(path)}
    out.update(llamacpp_peer.llamacpp_latency(path, args.input_len, args.output_len, vocab,
                                              args.threads, iters=args.num_iters))
    if args.p2:
        progress(f"{what}: P2")
        out.update(llamacpp_peer.llamacpp_throughput(
            path, args.input_len, args.output_len, args.num_prompts, vocab, args.threads))
    return out


def _fig(results: dict[str, dict[str, Any]], group: str, engine: str, key: str
         ) -> float | None:
    value = results.get(group, {}).get(engine, {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def bar_checks(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The bar's ratios, each with its threshold; ``passed`` is None when a figure is
    missing. Every ratio is written so that higher is better (times: the other / ours)."""
    dec, ttft = "decode_tokens_per_s", "ttft_ms"
    checks: list[tuple[str, float | None, float | None, float]] = [
        ("W4A16 decode / glowlm bf16 decode", _fig(results, "W4A16 g128", "glowlm", dec),
         _fig(results, "bf16", "glowlm", dec), 2.5),
        ("W4A16 decode / llama.cpp Q4_0 decode", _fig(results, "W4A16 g128", "glowlm", dec),
         _fig(results, "W4A16 g128", "llama.cpp", dec), 1.0),
        ("W8A8 decode / glowlm bf16 decode", _fig(results, "W8A8", "glowlm", dec),
         _fig(results, "bf16", "glowlm", dec), 1.6),
        ("glowlm bf16 TTFT / W8A8 TTFT (W8A8 TTFT <= bf16)", _fig(results, "bf16", "glowlm",
                                                                  ttft),
         _fig(results, "W8A8", "glowlm", ttft), 1.0),
    ]
    for group in GROUPS:
        if group != "bf16" and "vllm" in results.get(group, {}):
            checks.append((f"{group} decode / vLLM CPU on the same checkpoint",
                           _fig(results, group, "glowlm", dec), _fig(results, group, "vllm",
                                                                      dec), 1.0))
    out = []
    for name, num, den, threshold in checks:
        ratio = num / den if num is not None and den else None
        out.append({"check": name, "ratio": ratio, "threshold": threshold,
                    "passed": None if ratio is None else ratio >= threshold})
    # Beside the bar: llama.cpp at the same bits (8-bit), and vLLM's own bf16.
    for name, group, engine in (("W8A8 decode / llama.cpp Q8_0 decode", "W8A8", "llama.cpp"),
                                ("glowlm bf16 decode / vLLM CPU bf16 decode", "bf16", "vllm"),
                                ("glowlm bf16 decode / llama.cpp bf16 decode", "bf16",
                                 "llama.cpp")):
        num, den = _fig(results, group, "glowlm", dec), _fig(results, group, engine, dec)
        out.append({"check": name, "ratio": num / den if num is not None and den else None,
                    "threshold": None, "passed": None})
    return out


def _cell(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"


def print_table(report: dict[str, Any]) -> None:
    h = report["host"]
    print(f"host: {h['cpu']} ({h['logical_cpus']} CPUs); flags: "
          f"{' '.join(h['flags_that_matter'])}; threads={report['threads']}")
    p = report["protocol"]
    rounds = f", {p['rounds']} rounds (medians)" if p.get("rounds", 1) > 1 else ""
    print(f"P1 in={p['input_len']} out={p['output_len']} median of {p['num_iters']}{rounds}"
          + (f"; P2 {p['num_prompts']} prompts" if p["p2"] else "")
          + (f"; load average {report['load_average'][0]:.1f} at the start"
             if report.get("load_average") else ""))
    if (p["input_len"], p["output_len"]) != (128, 128) or p["num_iters"] < 3:
        print("note: not the bar's protocol (P1 128 -> 128, median of 3): a smoke run")
    print(f"{'group':<17}{'engine':<11}{'checkpoint':<40}{'TTFT ms':>9}{'decode t/s':>12}"
          f"{'P2 t/s':>9}")
    for r in report["results"]:
        for engine in ("glowlm", "vllm", "llama.cpp"):
            e = r["engines"].get(engine)
            if e is None:
                continue
            line = (f"{r['dtype']:<17}{engine:<11}{e.get('checkpoint', '')[:39]:<40}"
                    f"{_cell(e.get('ttft_ms'), 1):>9}{_cell(e.get('decode_tokens_per_s'), 2):>12}"
                    f"{_cell(e.get('output_tokens_per_s'), 1):>9}")
            if "error" in e:
                line += f"  FAILED: {e['error'][:120]}"
            elif e.get("platform"):                  # glowlm's own report (kernels: JSON)
                line += f"  {e['platform']}/{e.get('isa', '?')}"
            print(line)
    warnings = dict.fromkeys(w for r in report["results"]
                             for w in r["engines"].get("glowlm", {}).get("warnings", ()))
    for w in warnings:
        print(f"glowlm: {w}")
    print("bar (one run; every ratio: higher = glowlm's quantized path better):")
    for c in report["bar"]:
        verdict = ("" if c["threshold"] is None else
                   " (missing)" if c["passed"] is None else
                   f" >= {c['threshold']:g}: {'PASS' if c['passed'] else 'FAIL'}")
        print(f"  {c['check']:<58}{_cell(c['ratio'], 2):>7}{verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", type=Path, nargs="?", default=REPO / ".bench_models",
                   help=f"directory holding {BASE} and its quantized copies "
                        "(default: .bench_models)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for every engine (default: all CPUs)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=3, help="P1 timed runs (after 1 warm-up)")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every checkpoint on every engine this many times, round "
                        "by round, and keep the medians (the bar's ratios then compare "
                        "figures taken in the same minutes)")
    p.add_argument("--vllm-rounds", type=int, default=1,
                   help="rounds that include vLLM CPU (its start-up takes minutes and its "
                        "figures are far from the bar's)")
    p.add_argument("--p2", action="store_true", help="also P2 (batch output tok/s)")
    p.add_argument("--num-prompts", type=int, default=32, help="P2 prompts")
    p.add_argument("--groups", nargs="+", choices=list(GROUPS), default=None,
                   help="measure only these groups (default: the three the bar names and "
                        "every GPTQ/AWQ checkpoint that was built)")
    p.add_argument("--vllm", action="store_true",
                   help="measure vLLM CPU on the same checkpoints (make vllm-peer)")
    p.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp")
    p.add_argument("--prepare", action="store_true",
                   help="only make the GGUFs (bf16, Q4_0, Q8_0) and check the checkpoints")
    p.add_argument("--kv-cache-gib", type=float, default=4,
                   help="KV cache of glowlm and vLLM alike (whole GiB for vLLM)")
    p.add_argument("--glowlm-bin", default=str(REPO / ".venv" / "bin" / "glowlm"))
    p.add_argument("--vllm-venv", default=str(REPO / ".venv-vllm"))
    p.add_argument("--convert-script", type=Path, default=None,
                   help="llama.cpp's convert_hf_to_gguf.py (default: from .venv-peers/src)")
    p.add_argument("--convert-python", default=sys.executable,
                   help="a Python with torch and transformers for the conversion")
    p.add_argument("--out", type=Path, default=None,
                   help="write PREFIX.json and the chart PREFIX.png")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models = args.models.resolve()
    base = checkpoint(models, None)
    if not (base / "config.json").is_file():
        raise SystemExit(f"no {base}/config.json: run `make bench-models`")
    missing = [checkpoint(models, GROUPS[g][0]).name for g in REQUIRED
               if not (checkpoint(models, GROUPS[g][0]) / "config.json").is_file()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)} in {models}: run "
                         f"`make bench-models-quant`")
    groups = args.groups or [g for g in GROUPS if g in REQUIRED or (
        checkpoint(models, GROUPS[g][0]) / "config.json").is_file()]
    ggufs = {} if args.no_llamacpp else prepare_ggufs(models, args)
    if args.prepare:
        for path in ggufs.values():
            print(f"{path}: {path.stat().st_size >> 20} MiB, {tensor_types(path)}")
        return 0
    import vllm_peer

    if args.vllm and not vllm_peer.available(args.vllm_venv):
        raise SystemExit(vllm_peer.MISSING)
    vocab = int(json.loads((base / "config.json").read_text())["vocab_size"])
    report: dict[str, Any] = {
        "model": str(base), "threads": args.threads, "host": bench_peers.host_description(),
        "protocol": {"input_len": args.input_len, "output_len": args.output_len,
                     "num_iters": args.num_iters, "p2": args.p2, "rounds": args.rounds,
                     "vllm_rounds": min(args.vllm_rounds, args.rounds),
                     "num_prompts": args.num_prompts},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": list(os.getloadavg()), "results": []}
    if ggufs:
        import llamacpp_peer

        llama_cpp = llamacpp_peer.import_llama_cpp()
        report["llama.cpp"] = (f"llama-cpp-python {llama_cpp.__version__}; "
                               f"{llama_cpp.llama_print_system_info().decode().strip()}")
    # Rounds: every (group, engine) once per round, in the same order, so a drift of the
    # machine's memory speed over minutes hits every figure alike; the medians are kept.
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        if args.rounds > 1:
            progress(f"round {r + 1} of {args.rounds}")
        for group in groups:
            scheme, outtype = GROUPS[group]
            model = checkpoint(models, scheme)
            runs.setdefault((group, "glowlm"), []).append(measure_glowlm(model, args))
            if args.vllm and r < args.vllm_rounds:
                runs.setdefault((group, "vllm"), []).append(measure_vllm(model, args))
            if outtype is not None and outtype in ggufs:
                runs.setdefault((group, "llama.cpp"), []).append(
                    measure_llamacpp(ggufs[outtype], vocab, args))
    by_group: dict[str, dict[str, Any]] = {}
    for group in groups:
        engines = {engine: merge_rounds(runs[group, engine])
                   for engine in ("glowlm", "vllm", "llama.cpp") if (group, engine) in runs}
        by_group[group] = engines
        report["results"].append({"dtype": group, "engines": engines})
    report["bar"] = bar_checks(by_group)
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print_table(report)
    if args.out:
        bench_peers.write_report(report, args.out, args.vllm_venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
