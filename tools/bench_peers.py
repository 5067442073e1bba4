#!/usr/bin/env python3
"""llama.cpp beside glowlm: same model, dtype, threads and protocol, in one run.

Machines are noisy (a shared 2-core VM more than most), so the only ratios worth
printing are those of one run. For each ``--dtype`` (GGUF outtype: bf16, f16, f32)
this converts the Hugging Face checkpoint to GGUF once (cached in ``--gguf-dir``,
default ``<models>/gguf/``), measures llama.cpp P1 (and P2 unless ``--skip-p2``)
through :mod:`glowlm.bench.llamacpp_peer`, and with ``--glowlm`` runs
``glowlm bench latency|throughput --json`` at the matching dtype in a subprocess
(so the two engines' thread pools never share a process) and prints the ratios.

Run it with the peers venv (``make peers``; it sees glowlm, torch and transformers
through $(VENV)), or with any Python that has glowlm and llama-cpp-python:

    .venv-peers/bin/python tools/bench_peers.py .bench_models/llama-1b-rand \\
        --dtype bf16 f16 f32 --glowlm

Conversion uses llama.cpp's own convert_hf_to_gguf.py from the llama-cpp-python
source that ``make peers`` keeps in .venv-peers/src/. Its one tweak: a byte-level
BPE tokenizer whose hash llama.cpp does not list (ours: trained here, vocab 32000)
gets the GPT-2 pre-tokenizer, which is what byte-level BPE with its regex is; the
benchmark feeds token ids, so the tokenizer never runs anyway.
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

GLOWLM_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}

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


def run_glowlm(glowlm: str, kind: str, model_dir: Path, outtype: str,
               args: argparse.Namespace) -> dict[str, Any]:
    """``glowlm bench KIND --json`` at the dtype matching the GGUF; its JSON object."""
    cmd = [glowlm, "bench", kind, str(model_dir), "--dtype", GLOWLM_DTYPE[outtype],
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--json"]
    cmd += (["--num-iters", str(args.num_iters)] if kind == "latency"
            else ["--num-prompts", str(args.num_prompts)])
    env = dict(os.environ)
    if args.threads != os.cpu_count():  # glowlm binds one thread per core it is given
        env["GLOWLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(dtype: str, engine: str, ttft: float | None, decode: float | None,
         p2: float | None, digits: tuple[int, int, int] = (1, 2, 2)) -> str:
    return (f"{dtype:<6}{engine:<12}{_fmt(ttft, digits[0]):>10}{_fmt(decode, digits[1]):>14}"
            f"{_fmt(p2, digits[2]):>14}")


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'dtype':<6}{'engine':<12}{'ttft_ms':>10}{'decode_tok/s':>14}{'p2_out_tok/s':>14}")
    for r in results:
        lc, gl = r["llama.cpp"], r.get("glowlm")
        print(_row(r["dtype"], "llama.cpp", lc["ttft_ms"], lc["decode_tokens_per_s"],
                   lc.get("output_tokens_per_s")))
        if gl:
            print(_row(r["dtype"], "glowlm", gl["ttft_ms"], gl["decode_tokens_per_s"],
                       gl.get("output_tokens_per_s")))
            ratio = r["ratio"]
            print(_row(r["dtype"], "ratio", ratio["ttft"], ratio["decode"], ratio.get("p2"),
                       (2, 2, 2)))
    if any("glowlm" in r for r in results):
        print("ratio: glowlm speed / llama.cpp speed (ttft: llama.cpp ms / glowlm ms), "
              ">1 = glowlm faster")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="Hugging Face model directory")
    p.add_argument("--dtype", nargs="+", choices=list(GLOWLM_DTYPE), default=["bf16"],
                   help="GGUF outtype(s); glowlm runs at the matching dtype")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for both engines (default: all CPUs)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=3, help="P1 timed runs (after 1 warm-up)")
    p.add_argument("--num-prompts", type=int, default=32, help="P2 prompts")
    p.add_argument("--skip-p2", action="store_true", help="P1 only")
    p.add_argument("--glowlm", action="store_true",
                   help="also run glowlm bench at the same dtype and print the ratios")
    p.add_argument("--glowlm-bin", default=str(REPO / ".venv" / "bin" / "glowlm"))
    p.add_argument("--gguf-dir", type=Path, default=None,
                   help="GGUF cache (default: <model's parent>/gguf)")
    p.add_argument("--convert-script", type=Path, default=None,
                   help="llama.cpp's convert_hf_to_gguf.py (default: from .venv-peers/src)")
    p.add_argument("--convert-python", default=sys.executable,
                   help="a Python with torch and transformers for the conversion")
    p.add_argument("--json", action="store_true", help="print the results as one JSON list")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from glowlm.bench import llamacpp_peer

    llama_cpp = llamacpp_peer.import_llama_cpp()  # fail before converting anything
    model_dir = args.model.resolve()
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(config["vocab_size"])
    gguf_dir = args.gguf_dir or model_dir.parent / "gguf"
    script = args.convert_script or find_convert_script()
    print(f"llama-cpp-python {llama_cpp.__version__}; "
          f"{llama_cpp.llama_print_system_info().decode().strip()}", file=sys.stderr)
    results = []
    for outtype in args.dtype:
        gguf = gguf_dir / f"{model_dir.name}-{outtype}.gguf"
        if not gguf.is_file():
            if script is None:
                raise SystemExit("no convert_hf_to_gguf.py: run `make peers` or pass "
                                 "--convert-script")
            gguf = convert(model_dir, outtype, gguf_dir, script, args.convert_python)
        progress(f"{outtype}: llama.cpp P1")
        lc: dict[str, Any] = llamacpp_peer.llamacpp_latency(
            gguf, args.input_len, args.output_len, vocab, args.threads, iters=args.num_iters)
        if not args.skip_p2:
            progress(f"{outtype}: llama.cpp P2")
            lc.update(llamacpp_peer.llamacpp_throughput(
                gguf, args.input_len, args.output_len, args.num_prompts, vocab, args.threads))
        result: dict[str, Any] = {"dtype": outtype, "model": str(model_dir), "gguf": str(gguf),
                                  "threads": args.threads, "llama.cpp": lc}
        if args.glowlm:
            progress(f"{outtype}: glowlm P1")
            gl = run_glowlm(args.glowlm_bin, "latency", model_dir, outtype, args)
            ratio = {"ttft": lc["ttft_ms"] / gl["ttft_ms"],
                     "decode": gl["decode_tokens_per_s"] / lc["decode_tokens_per_s"]}
            if not args.skip_p2:
                progress(f"{outtype}: glowlm P2")
                gl2 = run_glowlm(args.glowlm_bin, "throughput", model_dir, outtype, args)
                gl["output_tokens_per_s"] = gl2["output_tokens_per_s"]
                ratio["p2"] = gl2["output_tokens_per_s"] / lc["output_tokens_per_s"]
            result.update(glowlm=gl, ratio=ratio)
        results.append(result)
    if args.json:
        print(json.dumps(results))
    else:
        print(f"{model_dir.name}, threads={args.threads}, P1 in={args.input_len} "
              f"out={args.output_len}" + ("" if args.skip_p2 else f", P2 {args.num_prompts} "
                                          "prompts"))
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
