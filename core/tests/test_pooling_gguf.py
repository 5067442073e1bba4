"""BERT-family GGUF files (llama.cpp's ``bert`` architecture) as pooling models.

Tiny BERT checkpoints written as llama.cpp's converter writes them
(``glowlm.testing.tiny_encoders.write_bert_gguf``: gguf's BERT tensor names, the
phantom-space WordPiece vocabulary, ``bert.pooling_type``) give the safetensors
checkpoint's tokens and vectors: F32 exactly (cosine >= 0.9999), Q8_0 run natively as
8-bit blocks within 1e-3 of it; a classifier head (``cls`` + ``cls.output``) gives the
cross-encoder's scores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from glowlm.entrypoints.llm import LLM
from glowlm.model_loader.gguf_bert import wordpiece_vocab
from glowlm.testing.tiny_encoders import make_tiny_encoder, write_bert_gguf

TEXTS = ["the cat is on the tree", "what is the capital of france", "red", "paris, rome!"]


@pytest.fixture(autouse=True)
def _gguf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOWLM_GGUF_CACHE", str(tmp_path / "gguf-cache"))


def _vectors(path: Path, **kwargs: object) -> tuple[torch.Tensor, list[list[int]]]:
    out = LLM(str(path), show_progress=False, **kwargs).embed(TEXTS, use_tqdm=False)
    return torch.tensor([o.outputs.embedding for o in out]), [o.prompt_token_ids for o in out]


def test_wordpiece_vocab_undoes_phantom_space() -> None:
    assert wordpiece_vocab(["[CLS]", "\u2581the", "ing", "\u2581paris"]) == \
        ["[CLS]", "the", "##ing", "paris"]


@pytest.mark.parametrize(("pooling", "qtype", "tol"), [("MEAN", "F32", 1e-4),
                                                       ("CLS", "Q8_0", 1e-3)])
def test_bert_gguf_embeddings_match_the_checkpoint(tmp_path: Path, pooling: str, qtype: str,
                                                   tol: float) -> None:
    path = make_tiny_encoder("BertModel", tmp_path / "bert")
    gguf_file = write_bert_gguf(path, tmp_path / f"bert-{qtype}.gguf", pooling, qtype)
    ref, ref_ids = _vectors(path, dtype="float32", pooler_config={"pooling_type": pooling})
    got, ids = _vectors(gguf_file, dtype="float32")  # pooling and Normalize from the file
    assert ids == ref_ids
    cos = torch.nn.functional.cosine_similarity(got, ref)
    assert cos.min() >= 1 - tol
    assert torch.allclose(got.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5)


def test_bert_gguf_cross_encoder_scores(tmp_path: Path) -> None:
    path = make_tiny_encoder("BertForSequenceClassification", tmp_path / "ce", num_labels=1)
    gguf_file = write_bert_gguf(path, tmp_path / "ce.gguf")
    docs = ["paris is the capital of france", "the cat", "blue sky"]
    ref = LLM(str(path), dtype="float32", show_progress=False).score(TEXTS[1], docs,
                                                                     use_tqdm=False)
    llm = LLM(str(gguf_file), dtype="float32", show_progress=False)
    assert type(llm.engine.model).__name__ == "BertForSequenceClassification"
    got = llm.score(TEXTS[1], docs, use_tqdm=False)
    torch.testing.assert_close(torch.tensor([s.outputs.score for s in got]),
                               torch.tensor([s.outputs.score for s in ref]),
                               atol=1e-5, rtol=1e-5)
