"""The pooling routes of a real ``glowlm serve``, through the official openai client
(``client.embeddings.create``) and httpx for ``/rerank``, ``/score``, ``/classify``.

Two servers: a sentence-transformers BERT embedder (mean pooling, Normalize, fp32),
compared with sentence-transformers' own vectors, and a BERT cross-encoder, whose
rerank order and scores are transformers'. A third, generating server answers the
pooling routes with a 400.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers
from glowlm.testing.server import ServerProcess, post, scrape_metrics, start_server, stop_server
from glowlm.testing.tiny_encoders import make_sentence_transformer, make_tiny_encoder
from glowlm.testing.tiny_models import make_tiny_model

TEXTS = ["the cat is on the tree", "what is the capital of france", "red", "big dog"]
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the cat", "rome is a city in italy", "blue sky"]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    pytest.importorskip("sentence_transformers")
    root = tmp_path_factory.mktemp("embed")
    path = make_sentence_transformer(root / "st", pooling="mean")
    srv = start_server(path, root / "server.log", "--runner", "pooling", "--dtype", "float32",
                       "--served-model-name", "emb")
    yield srv, path
    stop_server(srv)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("rerank")
    path = make_tiny_encoder("BertForSequenceClassification", root / "ce", num_labels=1)
    srv = start_server(path, root / "server.log", "--dtype", "float32",
                       "--served-model-name", "rr")
    yield srv, path
    stop_server(srv)


def _client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def test_embeddings_match_sentence_transformers(embedder: tuple[ServerProcess, Path]) -> None:
    from sentence_transformers import SentenceTransformer

    srv, path = embedder
    ref = SentenceTransformer(str(path), device="cpu").encode(TEXTS, convert_to_tensor=True)
    out = _client(srv).embeddings.create(model="emb", input=TEXTS)
    got = torch.tensor([d.embedding for d in out.data])
    assert [d.index for d in out.data] == list(range(len(TEXTS)))
    assert torch.nn.functional.cosine_similarity(got, ref.float()).min() >= 0.9999
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert out.usage.prompt_tokens == sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert out.usage.total_tokens == out.usage.prompt_tokens
    one = _client(srv).embeddings.create(model="emb", input=TEXTS[0])
    assert np.allclose(one.data[0].embedding, out.data[0].embedding, atol=1e-6)


def test_embeddings_token_ids_and_base64(embedder: tuple[ServerProcess, Path]) -> None:
    srv, path = embedder
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = [tok(t)["input_ids"] for t in TEXTS[:2]]
    client = _client(srv)
    by_ids = client.embeddings.create(model="emb", input=ids)
    by_text = client.embeddings.create(model="emb", input=TEXTS[:2])
    for a, b in zip(by_ids.data, by_text.data, strict=True):
        assert np.allclose(a.embedding, b.embedding, atol=1e-6)
    single = client.embeddings.create(model="emb", input=ids[0])
    assert np.allclose(single.data[0].embedding, by_text.data[0].embedding, atol=1e-6)
    raw = post(srv, "/v1/embeddings", {"input": TEXTS[:2], "encoding_format": "base64"})
    assert raw.status_code == 200
    vec = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vec, by_text.data[0].embedding, atol=1e-6)
    # the openai client asks for base64 itself when no format is given and decodes it
    assert len(client.embeddings.create(model="emb", input="red").data[0].embedding) == 64


def test_embedding_errors(embedder: tuple[ServerProcess, Path]) -> None:
    srv, _ = embedder
    long = " ".join(["cat"] * 300)
    r = post(srv, "/v1/embeddings", {"input": long})
    assert r.status_code == 400 and "truncate_prompt_tokens" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "input"
    r = post(srv, "/v1/embeddings", {"input": long, "truncate_prompt_tokens": 16})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 16
    r = post(srv, "/v1/embeddings", {"input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = post(srv, "/v1/embeddings", {"input": "red", "dimensions": 8})
    assert r.status_code == 400 and "Matryoshka" in r.json()["error"]["message"]
    r = post(srv, "/v1/embeddings", {"input": "red", "model": "nope"})
    assert r.status_code == 404
    r = post(srv, "/v1/completions", {"prompt": "hello"})
    assert r.status_code == 400 and "pooling model" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        _client(srv).chat.completions.create(model="emb",
                                             messages=[{"role": "user", "content": "x"}])
    r = post(srv, "/classify", {"input": "red"})
    assert r.status_code == 400 and "classification head" in r.json()["error"]["message"]


def test_embedder_scores_by_cosine(embedder: tuple[ServerProcess, Path]) -> None:
    srv, _ = embedder
    vecs = {t: np.array(d.embedding) for t, d in zip(
        [QUERY, *DOCS], _client(srv).embeddings.create(model="emb", input=[QUERY, *DOCS]).data,
        strict=True)}
    r = post(srv, "/score", {"text_1": QUERY, "text_2": DOCS})
    assert r.status_code == 200
    got = [d["score"] for d in r.json()["data"]]
    want = [float(vecs[QUERY] @ vecs[d]) for d in DOCS]
    assert np.allclose(got, want, atol=1e-5)
    r = post(srv, "/pooling", {"input": DOCS[0], "task": "encode"})
    assert r.status_code == 200, r.text
    rows = r.json()["data"][0]["data"]
    assert len(rows) == r.json()["usage"]["prompt_tokens"] and len(rows[0]) == 64
    metrics = scrape_metrics(srv.url, "emb")
    assert metrics.get("vllm:prompt_tokens_total", 0) > 0


def test_rerank_orders_as_the_cross_encoder(reranker: tuple[ServerProcess, Path]) -> None:
    srv, path = reranker
    model = transformers.BertForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        ref = torch.sigmoid(model(**tok([QUERY] * len(DOCS), DOCS, return_tensors="pt",
                                        padding=True)).logits).reshape(-1).tolist()
    for route in ("/rerank", "/v1/rerank"):
        r = httpx.post(srv.url + route, json={"model": "rr", "query": QUERY,
                                              "documents": DOCS, "top_n": 3}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        order = sorted(range(len(DOCS)), key=lambda i: -ref[i])[:3]
        assert [x["index"] for x in body["results"]] == order
        for x in body["results"]:
            assert abs(x["relevance_score"] - ref[x["index"]]) < 1e-5
            assert x["document"]["text"] == DOCS[x["index"]]
        assert body["usage"]["total_tokens"] > 0
    r = httpx.post(srv.url + "/score", json={"text_1": QUERY, "text_2": DOCS}, timeout=60)
    assert np.allclose([d["score"] for d in r.json()["data"]], ref, atol=1e-5)
    r = httpx.post(srv.url + "/rerank", json={"query": QUERY, "documents": [{"text": DOCS[0]}],
                                              "return_documents": False}, timeout=60)
    assert r.status_code == 200 and "document" not in r.json()["results"][0]
    r = httpx.post(srv.url + "/classify", json={"input": DOCS[:2]}, timeout=60)
    assert r.status_code == 200 and r.json()["data"][0]["num_classes"] == 1
    r = httpx.post(srv.url + "/rerank", json={"query": QUERY, "documents": []}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    r = httpx.post(srv.url + "/score", json={"text_1": DOCS[:2], "text_2": DOCS[:3]},
                   timeout=60)
    assert r.status_code == 400


def test_pooling_routes_on_a_generation_model(tmp_path: Path) -> None:
    model = make_tiny_model("llama", tmp_path / "llama")
    srv = start_server(model, tmp_path / "server.log", "--block-size", "32")
    try:
        with pytest.raises(openai.BadRequestError, match="pooling model"):
            _client(srv).embeddings.create(model=str(model), input="hello")
        for route in ("/rerank", "/score", "/classify"):
            r = post(srv, route, {"query": "a", "documents": ["b"], "text_1": "a",
                                  "text_2": "b", "input": "a"})
            assert r.status_code == 400 and "--runner pooling" in r.json()["error"]["message"]
    finally:
        stop_server(srv)


def test_qwen3_embedding_server_matches_sentence_transformers(tmp_path: Path) -> None:
    """A Qwen3-Embedding-like directory (a decoder, last-token pooling, Normalize) served
    through the causal path: /v1/embeddings gives sentence-transformers' vectors."""
    from sentence_transformers import SentenceTransformer

    base = make_tiny_model("qwen3", tmp_path / "qwen3")
    path = make_sentence_transformer(tmp_path / "st", pooling="lasttoken", base=base)
    texts = ["def fibonacci(n):", "a", "class Greeter:", "return a, b", "hello " * 40]
    ref = SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_tensor=True)
    srv = start_server(path, tmp_path / "server.log", "--dtype", "float32",
                       "--block-size", "32")
    try:
        out = _client(srv).embeddings.create(model=str(path), input=texts)
        got = torch.tensor([d.embedding for d in out.data])
        assert torch.nn.functional.cosine_similarity(got, ref.float()).min() >= 0.9999
    finally:
        stop_server(srv)
