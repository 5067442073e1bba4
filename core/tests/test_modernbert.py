"""ModernBERT encoders (embedding, classifier, cross-encoder) against transformers.

The tiny checkpoint (glowlm.testing.tiny_encoders) has one global layer and two local
layers with an 8-token window (4 positions on each side), so the longer inputs here
are cut by the local band and the short ones are not. All of them run in one call,
which makes packed steps with several runs of equal length. The references are
transformers' ModernBertModel / ModernBertForSequenceClassification and
sentence-transformers, all in fp32. The bounds: hidden states and embeddings within
1e-4 (cosine >= 0.9999), probabilities and scores within 1e-5. At fp32 the two
implementations differ only in summation order, and the differences seen are about
1e-6.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from glowlm import PoolingParams
from glowlm.entrypoints.llm import LLM
from glowlm.errors import ModelLoadError
from glowlm.testing.tiny_encoders import make_sentence_transformer, make_tiny_encoder

TEXTS = ["the cat is on the tree and the dog is in the house by the river",
         "what is the capital of france", "red", "big dog",
         "paris is the capital of france and rome is the capital of italy",
         "a small bird", "the", "rain and snow in berlin"]
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the cat", "rome is a city in italy", "blue sky"]
WINDOW = 4  # local_attention 8 // 2


def _llm(path: Path, **kwargs: object) -> LLM:
    return LLM(str(path), dtype="float32", show_progress=False, **kwargs)


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


@pytest.mark.parametrize("pooling", ["CLS", "MEAN"])
def test_hidden_states_match_transformers(tmp_path: Path, pooling: str) -> None:
    path = make_tiny_encoder("ModernBertModel", tmp_path / "mb")
    ref_model = transformers.ModernBertModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    lens = [len(tok(t)["input_ids"]) for t in TEXTS]
    assert max(lens) > 2 * WINDOW + 1 and min(lens) <= WINDOW + 1  # both kinds of run
    llm = _llm(path, pooler_config={"pooling_type": pooling, "normalize": False})
    out = llm.embed(TEXTS, use_tqdm=False)
    for text, o in zip(TEXTS, out, strict=True):
        with torch.no_grad():
            h = ref_model(**tok(text, return_tensors="pt")).last_hidden_state[0]
        ref = h[0] if pooling == "CLS" else h.mean(0)
        got = torch.tensor(o.outputs.embedding)
        assert _cos(got, ref) >= 0.9999
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    tokens = llm.encode(TEXTS[0], PoolingParams(task="encode"), use_tqdm=False)[0]
    with torch.no_grad():
        h = ref_model(**tok(TEXTS[0], return_tensors="pt")).last_hidden_state[0]
    torch.testing.assert_close(tokens.outputs.data, h, atol=1e-4, rtol=1e-4)


def test_local_window_is_applied(tmp_path: Path) -> None:
    """The same weights with a window wide enough to see everything give other states
    for a long input: the band is what makes the output match transformers above."""
    narrow = make_tiny_encoder("ModernBertModel", tmp_path / "narrow")
    wide = make_tiny_encoder("ModernBertModel", tmp_path / "wide", local_attention=512)
    a = torch.tensor(_llm(narrow).embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding)
    b = torch.tensor(_llm(wide).embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding)
    assert not torch.allclose(a, b, atol=1e-3)
    ref = transformers.ModernBertModel.from_pretrained(wide).eval()
    tok = transformers.AutoTokenizer.from_pretrained(wide)
    with torch.no_grad():
        h = ref(**tok(TEXTS[0], return_tensors="pt")).last_hidden_state[0, 0]
    assert _cos(b, h) >= 0.9999


@pytest.mark.parametrize("classifier_pooling", ["cls", "mean"])
def test_classifier_matches_transformers(tmp_path: Path, classifier_pooling: str) -> None:
    path = make_tiny_encoder("ModernBertForSequenceClassification", tmp_path / "cls",
                             num_labels=3, classifier_pooling=classifier_pooling)
    ref_model = transformers.ModernBertForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    out = _llm(path).classify(TEXTS, use_tqdm=False)
    for text, o in zip(TEXTS, out, strict=True):
        with torch.no_grad():
            ref = torch.softmax(ref_model(**tok(text, return_tensors="pt")).logits[0], -1)
        torch.testing.assert_close(torch.tensor(o.outputs.probs), ref, atol=1e-5, rtol=1e-5)
        assert o.outputs.num_classes == 3


def test_cross_encoder_scores_and_rerank_order(tmp_path: Path) -> None:
    path = make_tiny_encoder("ModernBertForSequenceClassification", tmp_path / "rr",
                             num_labels=1)
    ref_model = transformers.ModernBertForSequenceClassification.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    refs = []
    for doc in DOCS:  # one pair at a time: no padding in the reference
        with torch.no_grad():
            refs.append(torch.sigmoid(ref_model(**tok(QUERY, doc, return_tensors="pt"))
                                      .logits.reshape(())))
    ref = torch.stack(refs)
    scores = torch.tensor([s.outputs.score
                           for s in _llm(path).score(QUERY, DOCS, use_tqdm=False)])
    torch.testing.assert_close(scores, ref, atol=1e-5, rtol=1e-5)
    assert scores.argsort(descending=True).tolist() == ref.argsort(descending=True).tolist()


def test_sentence_transformers_directory_matches(tmp_path: Path) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    path = make_sentence_transformer(tmp_path / "st", pooling="mean", arch="ModernBertModel")
    ref = sentence_transformers.SentenceTransformer(str(path), device="cpu").encode(
        TEXTS, convert_to_tensor=True)
    got = torch.tensor([o.outputs.embedding
                        for o in _llm(path).embed(TEXTS, use_tqdm=False)])
    assert got.shape == ref.shape
    assert _cos(got, ref.float()).min() >= 0.9999


def test_masked_lm_checkpoint_embeds_and_bad_layer_types_refused(tmp_path: Path) -> None:
    """A ModernBertForMaskedLM checkpoint (how the base models ship) loads as the
    embedding model when its architecture is overridden, its LM head skipped; a
    config whose layer kinds glowlm does not know is one line."""
    path = make_tiny_encoder("ModernBertForMaskedLM", tmp_path / "mlm")
    ref = transformers.ModernBertModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    llm = _llm(path, hf_overrides={"architectures": ["ModernBertModel"]},
               pooler_config={"pooling_type": "MEAN", "normalize": False})
    got = torch.tensor(llm.embed(TEXTS[4], use_tqdm=False)[0].outputs.embedding)
    with torch.no_grad():
        h = ref(**tok(TEXTS[4], return_tensors="pt")).last_hidden_state[0].mean(0)
    torch.testing.assert_close(got, h, atol=1e-4, rtol=1e-4)
    with pytest.raises(ModelLoadError, match="layer_types"):
        _llm(path, hf_overrides={"architectures": ["ModernBertModel"],
                                 "layer_types": ["full_attention", "chunked", "x"]})
