"""Every benchmark ``glowlm bench`` runs, one module per subcommand, and what they share.

- the subcommands: :mod:`.offline` (``latency``, ``throughput``, ``roofline``),
  :mod:`.serve` (``serve``, with :mod:`.serve_datasets` and :mod:`.serve_results`),
  :mod:`.suite` (``suite``), :mod:`.allreduce`, :mod:`.tp`, :mod:`.structured_mask`
  (``structured-mask``); the verb itself is :mod:`glowlm.entrypoints.cli.bench`;
- the shared protocol (P1, P2, the read bandwidth): :mod:`.protocol`, and the rounds
  the peer tools take: :mod:`.rounds`;
- the transformers peer of ``--compare-hf``: :mod:`.hf_peer`.

The peer and developer harnesses (llama.cpp, vLLM CPU, kernel microbenchmarks) are
scripts in ``tools/``. Modules here may import the engine and the entry points; nothing
below them imports this package.
"""
