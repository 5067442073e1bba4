"""Pooling models offline (``LLM(..., runner="pooling")``) against the references.

BERT / XLM-RoBERTa encoders and their classifiers against transformers (fp32), a
sentence-transformers directory (mean pooling, Dense, Normalize) against
sentence-transformers itself, a Qwen3 decoder as a last-token embedding model against
transformers' ``Qwen3Model``; cosines >= 0.9999 (fp32 here agrees to ~1e-6) and
classifier probabilities to 1e-5. Inputs of mixed lengths in one call exercise the
packed batches (several runs of equal length per step).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from glowlm import PoolingParams
from glowlm.entrypoints.llm import LLM
from glowlm.errors import ConfigError, RequestError
from glowlm.testing.tiny_encoders import make_sentence_transformer, make_tiny_encoder
from glowlm.testing.tiny_models import make_tiny_model

TEXTS = ["the cat is on the tree", "what is the capital of france", "red", "big dog",
         "paris is the capital of france", "a small bird", "the", "rain and snow in berlin"]
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the cat", "rome is a city in italy", "blue sky"]


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def _llm(path: Path, **kwargs: object) -> LLM:
    return LLM(str(path), dtype="float32", show_progress=False, **kwargs)


@pytest.mark.parametrize("dense", [None, 24])
def test_sentence_transformers_directory_matches(tmp_path: Path, dense: int | None) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    path = make_sentence_transformer(tmp_path / "st", pooling="mean", dense=dense)
    ref = sentence_transformers.SentenceTransformer(str(path), device="cpu").encode(
        TEXTS, convert_to_tensor=True)
    out = _llm(path).embed(TEXTS, use_tqdm=False)
    got = torch.tensor([o.outputs.embedding for o in out])
    assert got.shape == ref.shape
    assert _cos(got, ref.float()).min() >= 0.9999
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)


@pytest.mark.parametrize("arch", ["BertModel", "XLMRobertaModel"])
@pytest.mark.parametrize("pooling", ["CLS", "MEAN"])
def test_encoder_hidden_states_match_transformers(tmp_path: Path, arch: str,
                                                  pooling: str) -> None:
    path = make_tiny_encoder(arch, tmp_path / arch)
    ref_model = getattr(transformers, arch).from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    llm = _llm(path, pooler_config={"pooling_type": pooling, "normalize": False})
    out = llm.embed(TEXTS, use_tqdm=False)
    for text, o in zip(TEXTS, out, strict=True):
        with torch.no_grad():
            h = ref_model(**tok(text, return_tensors="pt")).last_hidden_state[0]
        ref = h[0] if pooling == "CLS" else h.mean(0)
        got = torch.tensor(o.outputs.embedding)
        assert _cos(got, ref) >= 0.9999
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    tokens = llm.encode(TEXTS[1], PoolingParams(task="encode"), use_tqdm=False)[0]
    with torch.no_grad():
        h = ref_model(**tok(TEXTS[1], return_tensors="pt")).last_hidden_state[0]
    torch.testing.assert_close(tokens.outputs.data, h, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["BertForSequenceClassification",
                                  "XLMRobertaForSequenceClassification"])
def test_cross_encoder_scores_and_rerank_order(tmp_path: Path, arch: str) -> None:
    path = make_tiny_encoder(arch, tmp_path / arch, num_labels=1)
    ref_model = getattr(transformers, arch).from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok([QUERY] * len(DOCS), DOCS, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = torch.sigmoid(ref_model(**enc).logits).reshape(-1)
    llm = _llm(path)  # runner auto: the architecture only pools
    scores = torch.tensor([s.outputs.score for s in llm.score(QUERY, DOCS, use_tqdm=False)])
    torch.testing.assert_close(scores, ref, atol=1e-5, rtol=1e-5)
    assert scores.argsort(descending=True).tolist() == ref.argsort(descending=True).tolist()
    pairwise = llm.score(DOCS[:2], DOCS[2:], use_tqdm=False)
    assert len(pairwise) == 2
    with pytest.raises(RequestError, match="text_1 has 2 items"):
        llm.score(DOCS[:2], DOCS[:3], use_tqdm=False)


def test_classifier_probabilities(tmp_path: Path) -> None:
    path = make_tiny_encoder("BertForSequenceClassification", tmp_path / "cls", num_labels=3)
    ref_model = transformers.BertForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    out = _llm(path).classify(TEXTS, use_tqdm=False)
    for text, o in zip(TEXTS, out, strict=True):
        with torch.no_grad():
            ref = torch.softmax(ref_model(**tok(text, return_tensors="pt")).logits[0], -1)
        torch.testing.assert_close(torch.tensor(o.outputs.probs), ref, atol=1e-5, rtol=1e-5)
        assert o.outputs.num_classes == 3


def test_qwen3_last_token_embeddings(tmp_path: Path) -> None:
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    ref_model = transformers.AutoModel.from_pretrained(path).eval()  # Qwen3Model
    tok = transformers.AutoTokenizer.from_pretrained(path)
    texts = ["def fibonacci(n):", "a", "class Greeter:", "return a", "def hello(self)"]
    llm = _llm(path, runner="pooling")  # Qwen3ForCausalLM converted: convert auto = embed
    out = llm.embed(texts, use_tqdm=False)
    for text, o in zip(texts, out, strict=True):
        with torch.no_grad():
            h = ref_model(**tok(text, return_tensors="pt")).last_hidden_state[0, -1]
        assert _cos(torch.tensor(o.outputs.embedding), h) >= 0.9999
        assert abs(torch.tensor(o.outputs.embedding).norm().item() - 1) < 1e-5
    with pytest.raises(RequestError, match="pooling model"):
        llm.generate("hello")


def test_qwen3_base_model_checkpoint(tmp_path: Path) -> None:
    """A checkpoint saved as ``Qwen3Model`` (no ``model.`` prefix, no LM head) pools by
    default and gives the converted causal LM's vectors."""
    causal = make_tiny_model("qwen3", tmp_path / "qwen3")
    base = transformers.AutoModel.from_pretrained(causal)
    base.config.architectures = ["Qwen3Model"]
    base.save_pretrained(tmp_path / "base")
    transformers.AutoTokenizer.from_pretrained(causal).save_pretrained(tmp_path / "base")
    texts = ["def fibonacci(n):", "hello"]
    a = _llm(causal, runner="pooling", convert="embed").embed(texts, use_tqdm=False)
    b = _llm(tmp_path / "base").embed(texts, use_tqdm=False)
    for x, y in zip(a, b, strict=True):
        assert _cos(torch.tensor(x.outputs.embedding), torch.tensor(y.outputs.embedding)) \
            >= 0.99999


def test_truncation_limits_and_dimensions(tmp_path: Path) -> None:
    path = make_tiny_encoder("BertModel", tmp_path / "bert", is_matryoshka=True)
    llm = _llm(path)
    long = " ".join(["cat"] * 200)  # 202 tokens, the model takes 128
    with pytest.raises(RequestError, match="truncate_prompt_tokens"):
        llm.embed(long, use_tqdm=False)
    cut = llm.embed(long, use_tqdm=False, truncate_prompt_tokens=-1)[0]
    assert len(cut.prompt_token_ids) == 128
    cut = llm.embed(long, use_tqdm=False, truncate_prompt_tokens=10)[0]
    assert len(cut.prompt_token_ids) == 10
    full = torch.tensor(llm.embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding)
    short = llm.embed(TEXTS[0], use_tqdm=False, pooling_params=PoolingParams(dimensions=16))
    vec = torch.tensor(short[0].outputs.embedding)
    assert vec.shape == (16,) and abs(vec.norm().item() - 1) < 1e-5
    assert _cos(vec, full[:16]) >= 0.9999  # truncated, then normalized again
    with pytest.raises(RequestError, match="dimensions=65"):
        llm.embed(TEXTS[0], use_tqdm=False, pooling_params=PoolingParams(dimensions=65))
    with pytest.raises(RequestError, match="no classification head"):
        llm.classify(TEXTS[0], use_tqdm=False)


def test_configuration_errors(tmp_path: Path) -> None:
    path = make_tiny_encoder("BertModel", tmp_path / "bert")
    with pytest.raises(ConfigError, match="pooling model"):
        _llm(path, runner="generate")
    with pytest.raises(ConfigError, match="pooling_type"):
        _llm(path, pooler_config={"pooling_type": "MAX"})
    with pytest.raises(ConfigError, match="unknown key"):
        _llm(path, pooler_config={"pool": "CLS"})
    with pytest.raises(ConfigError, match="classif"):
        _llm(path, convert="classify")
    with pytest.raises(Exception, match="dimensions"):
        _llm(path).embed("red", use_tqdm=False, pooling_params=PoolingParams(dimensions=8))


def test_bench_embed_writes_json(tmp_path: Path) -> None:
    """``glowlm bench embed`` on a tiny model: one row per batch size, in the JSON."""
    import argparse
    import json

    from glowlm.bench import embed

    path = make_tiny_encoder("BertModel", tmp_path / "bert")
    p = argparse.ArgumentParser()
    embed.add_arguments(p)
    out = tmp_path / "embed.json"
    args = p.parse_args([str(path), "--batch-sizes", "1,3", "--input-len", "16", "--rounds",
                         "1", "--warmup", "0", "--dtype", "float32", "--output-json", str(out)])
    assert args.func(args) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["engine"], r["batch_size"]) for r in rows] == [("glowlm", 1), ("glowlm", 3)]
    assert all(r["tokens_per_s"] == r["seqs_per_s"] * 16 for r in rows)


def test_qwen3_sentence_transformers_directory(tmp_path: Path) -> None:
    """A Qwen3-Embedding-like directory (sentence-transformers around a decoder, last-token
    pooling, Normalize) gives sentence-transformers' vectors, inputs of several lengths."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    base = make_tiny_model("qwen3", tmp_path / "qwen3")
    path = make_sentence_transformer(tmp_path / "st", pooling="lasttoken", base=base)
    texts = ["def fibonacci(n):", "a", "class Greeter:", "return a, b"]
    ref = sentence_transformers.SentenceTransformer(str(path), device="cpu").encode(
        texts, convert_to_tensor=True)
    out = _llm(path).embed(texts, use_tqdm=False)  # saved as Qwen3Model: pools by itself
    got = torch.tensor([o.outputs.embedding for o in out])
    assert _cos(got, ref.float()).min() >= 0.9999


def test_generation_engine_refuses_a_pooling_model(tmp_path: Path) -> None:
    from glowlm.config import EngineConfig
    from glowlm.engine.llm_engine import LLMEngine

    path = make_tiny_encoder("BertModel", tmp_path / "bert")
    with pytest.raises(ConfigError, match="pooling model"):
        LLMEngine(EngineConfig.create(str(path)), show_progress=False)


def test_cli_pooling_flags() -> None:
    import argparse

    from glowlm.entrypoints.cli.engine_args import add_engine_args, engine_kwargs

    p = argparse.ArgumentParser()
    add_engine_args(p, online=True)
    args = p.parse_args(["--runner", "pooling", "--convert", "embed", "--pooler-config",
                         '{"pooling_type": "MEAN", "normalize": false}'])
    kwargs = engine_kwargs(args)
    assert kwargs["runner"] == "pooling" and kwargs["convert"] == "embed"
    assert kwargs["pooler_config"] == {"pooling_type": "MEAN", "normalize": False}
    with pytest.raises(SystemExit):
        p.parse_args(["--pooler-config", "[1]"])


@pytest.mark.parametrize("labels", [1, 3])
def test_qwen3_sequence_classifier_matches_transformers(tmp_path: Path, labels: int) -> None:
    """A decoder classifier (``score`` on the last token): one label is a reranker
    (Qwen3-Reranker's seq-cls checkpoints), several a classifier."""
    causal = make_tiny_model("qwen3", tmp_path / "qwen3")
    config = transformers.AutoConfig.from_pretrained(causal)
    config.num_labels, config.architectures = labels, ["Qwen3ForSequenceClassification"]
    tok = transformers.AutoTokenizer.from_pretrained(causal)
    config.pad_token_id = tok.eos_token_id
    torch.manual_seed(0)
    ref_model = transformers.Qwen3ForSequenceClassification(config).eval()
    ref_model.save_pretrained(tmp_path / "cls")
    tok.save_pretrained(tmp_path / "cls")
    texts = ["def fibonacci(n):", "a", "class Greeter: return f"]
    llm = _llm(tmp_path / "cls")  # runner auto: the architecture only pools
    if labels == 1:
        got = torch.tensor([s.outputs.score for s in llm.score(texts[0], texts[1:],
                                                               use_tqdm=False)])
        pairs = [tok(texts[0], t)["input_ids"] for t in texts[1:]]
        with torch.no_grad():
            ref = torch.sigmoid(torch.cat([ref_model(torch.tensor([p])).logits for p in pairs]))
        torch.testing.assert_close(got, ref.reshape(-1), atol=1e-5, rtol=1e-5)
        return
    out = llm.classify(texts, use_tqdm=False)
    for text, o in zip(texts, out, strict=True):
        with torch.no_grad():
            ref = torch.softmax(ref_model(**tok(text, return_tensors="pt")).logits[0], -1)
        torch.testing.assert_close(torch.tensor(o.outputs.probs), ref, atol=1e-5, rtol=1e-5)
