"""The pooling bar's correctness half, on checkpoints no test uses: cosines and rerank order.

Writes three seeded random checkpoints of shapes and seeds the tests do not use:

- a BERT embedder in the sentence-transformers layout (mean pooling, Normalize);
- a Qwen3 embedder (last-token pooling, Normalize);
- a BERT cross-encoder.

It serves each with ``glowlm serve`` on this host's platform, with compiled
kernels, and then checks:

- ``/v1/embeddings`` through the official ``openai`` client, against
  sentence-transformers' fp32 vectors: the smallest cosine over all inputs, for
  one request per input and for one batched request;
- ``/rerank``'s order, against sentence-transformers' ``CrossEncoder`` scores.

It prints one JSON line and exits 1 if a cosine is below 0.9999 or an order differs.

Usage: python tools/embed_bar.py [--dtype float32] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

TEXTS = ["how do I bake bread at home", "the quick brown fox", "paris",
         "what is the tallest mountain in the world and how high is it",
         "rain is expected in berlin tomorrow", "a", "capital of italy", "blue whales eat krill",
         "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"]
QUERY = "which city is the capital of france"
DOCS = ["paris is the capital of france", "the cat sat on the mat",
        "berlin is a city in germany", "france borders spain", "bread needs yeast"]


def _serve(model: Path, log: Path, dtype: str):  # noqa: ANN202 - ServerProcess
    from glowlm.testing.server import start_server

    return start_server(model, log, "--dtype", dtype, "--served-model-name", "m",
                        env={"GLOWLM_DISABLE_KERNELS": "0", "OMP_NUM_THREADS": "2"})


def _embed_cosines(model: Path, log: Path, dtype: str) -> dict[str, float]:
    import openai
    from glowlm.testing.server import stop_server
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(model), device="cpu").encode(TEXTS, convert_to_tensor=True)
    srv = _serve(model, log, dtype)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
        one = [client.embeddings.create(model="m", input=t).data[0].embedding for t in TEXTS]
        batch = [d.embedding for d in client.embeddings.create(model="m", input=TEXTS).data]
    finally:
        stop_server(srv)

    def worst(rows: list[list[float]]) -> float:
        got = torch.tensor(rows)
        return float(torch.nn.functional.cosine_similarity(got, ref.float(), dim=-1).min())

    return {"min_cosine_single": worst(one), "min_cosine_batch": worst(batch)}


def _rerank_order(model: Path, log: Path, dtype: str) -> dict[str, object]:
    import httpx
    from glowlm.testing.server import stop_server
    from sentence_transformers import CrossEncoder

    ref = CrossEncoder(str(model), device="cpu").predict([(QUERY, d) for d in DOCS])
    want = sorted(range(len(DOCS)), key=lambda i: -float(ref[i]))
    srv = _serve(model, log, dtype)
    try:
        r = httpx.post(srv.url + "/rerank", json={"model": "m", "query": QUERY,
                                                  "documents": DOCS}, timeout=120)
        r.raise_for_status()
        got = [x["index"] for x in r.json()["results"]]
    finally:
        stop_server(srv)
    return {"rerank_order": got, "cross_encoder_order": want, "rerank_same": got == want}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", help="glowlm's dtype (reference: fp32)")
    p.add_argument("--keep", type=Path, help="write the checkpoints here (default: a temp dir)")
    args = p.parse_args(argv)

    from glowlm.testing.tiny_encoders import make_sentence_transformer, make_tiny_encoder
    from glowlm.testing.tiny_models import make_tiny_model

    root = args.keep or Path(tempfile.mkdtemp(prefix="embed-bar-"))
    bert = make_sentence_transformer(root / "bert-st", pooling="mean", seed=7)
    qwen = make_tiny_model("qwen3", root / "qwen3-base", seed=11, hidden_size=96,
                           intermediate_size=160)
    qwen_st = make_sentence_transformer(root / "qwen3-st", pooling="lasttoken", base=qwen)
    cross = make_tiny_encoder("BertForSequenceClassification", root / "cross", seed=13,
                              num_labels=1, hidden_size=96, num_hidden_layers=3)
    report: dict[str, object] = {"dtype": args.dtype, "dir": str(root)}
    report["bert"] = _embed_cosines(bert, root / "bert.log", args.dtype)
    report["qwen3"] = _embed_cosines(qwen_st, root / "qwen3.log", args.dtype)
    report.update(_rerank_order(cross, root / "cross.log", args.dtype))
    print(json.dumps(report))
    cosines = [v for k in ("bert", "qwen3") for v in report[k].values()]  # type: ignore[union-attr]
    return 0 if min(cosines) >= 0.9999 and report["rerank_same"] else 1


if __name__ == "__main__":
    sys.exit(main())
