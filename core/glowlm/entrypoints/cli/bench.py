"""``glowlm bench KIND``: every benchmark users run, one subcommand each.

This module is the verb only: each subcommand's flags and measurement live in
:mod:`glowlm.bench` (one module per benchmark, each with ``add_arguments(parser)``
setting ``func``), imported when the subcommand runs or its help is shown:

- ``latency``, ``throughput``, ``roofline``: P1, P2 and the roofline on the offline
  engine (:mod:`glowlm.bench.offline`);
- ``serve``: load a running OpenAI-compatible server (:mod:`glowlm.bench.serve`);
- ``suite``: the serving cases of ``benchmark/serving-tests-cpu.json``
  (:mod:`glowlm.bench.suite`);
- ``allreduce``: one shared-memory all-reduce between local ranks
  (:mod:`glowlm.bench.allreduce`);
- ``tp``: decode at TP = N against TP = 1, alternated runs (:mod:`glowlm.bench.tp`);
- ``structured-mask``: what structured outputs cost per decode step
  (:mod:`glowlm.bench.structured_mask`);
- ``embed``: embedding throughput of a pooling model per batch size
  (:mod:`glowlm.bench.embed`);
- ``lora``: P2 and batched decode with 0, 1, 4 and 16 LoRA adapters in one batch
  (:mod:`glowlm.bench.lora`).

The developer and peer harnesses (glowlm beside llama.cpp, vLLM and transformers;
kernel microbenchmarks) are scripts in ``tools/`` (tools/README.md).
"""

from __future__ import annotations

import argparse
import importlib


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmarks: latency, throughput, roofline, serve, suite, allreduce, "
                      "tp, structured-mask, embed, lora")
    sub = p.add_subparsers(dest="bench", metavar="KIND", required=True)
    from glowlm.bench import offline

    for kind, helptext in offline.KINDS.items():
        offline.add_arguments(sub.add_parser(kind, help=helptext), kind)
    serve = importlib.import_module("glowlm.bench.serve")
    q = sub.add_parser("serve", help="load a running server and report throughput and latency",
                       description=(serve.__doc__ or "").split("\n\n")[0] or None)
    serve.add_arguments(q)
    q.set_defaults(func=serve.run)
    suite = sub.add_parser(
        "suite", help="run the serving benchmark cases of a JSON file (benchmark/)",
        description="Run every case of benchmark/serving-tests-cpu.json (or SERVING_JSON): "
                    "start glowlm serve, load it with glowlm bench serve, save results under "
                    "benchmark/results/ with a .commands file. DRY_RUN=1 only writes the "
                    "commands; MODEL_FILTER and DTYPE_FILTER (regular expressions) select cases.")
    suite.set_defaults(func=lambda args: _suite())
    for kind, module, helptext in (
            ("allreduce", "allreduce", "one shared-memory all-reduce between local ranks "
                                       "(median and p90 time)"),
            ("tp", "tp", "decode at TP = N against TP = 1 on one model, alternated runs"),
            ("structured-mask", "structured_mask", "what structured outputs cost per "
                                                   "decode step"),
            ("embed", "embed", "embedding throughput (sequences/s, tokens/s) per batch "
                               "size, beside sentence-transformers"),
            ("lora", "lora", "P2 and batched decode with 0, 1, 4 and 16 LoRA adapters in "
                             "one batch")):
        mod = importlib.import_module(f"glowlm.bench.{module}")
        mod.add_arguments(sub.add_parser(
            kind, help=helptext, description=(mod.__doc__ or "").split("\n\n")[0] or None))


def _suite() -> int:
    from glowlm.bench.suite import run_suite

    return run_suite()
