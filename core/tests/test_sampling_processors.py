"""The sampler's per-request processors against a plain reference: logit_bias,
allowed_token_ids, bad_words and the llguidance grammar mask, batched with ordinary rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from glowlm.errors import RequestError
from glowlm.sampling.params import SamplingParams, StructuredOutputsParams
from glowlm.sampling.processors import add_processors, bad_words_token_ids, prepare_params
from glowlm.sampling.sampler import SamplingBatch, sample
from glowlm.sampling.structured import bitmask_to_bool

VOCAB = 384


@dataclass(eq=False)
class Req:
    eos_token_ids: frozenset[int] = frozenset({1})


@dataclass(eq=False)
class Row:
    """The two attributes the processors read from an engine Sequence."""

    output_token_ids: list[int] = field(default_factory=list)
    request: Req = field(default_factory=Req)


def greedy_batch(n: int) -> SamplingBatch:
    return SamplingBatch(torch.zeros(n), None, None, None, None, None, greedy=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir("llama")))


def test_bias_allowed_and_bad_words_match_reference(tokenizer: object) -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, VOCAB)
    params = [SamplingParams(temperature=0, logit_bias={7: 50.0, 9: -3.0}),
              SamplingParams(temperature=0, allowed_token_ids=[3, 4, 5]),
              SamplingParams(temperature=0),
              SamplingParams(temperature=0, bad_words=["def"])]
    for p in params:
        prepare_params(p, tokenizer, VOCAB, [1])
    rows = [Row(), Row(), Row(), Row()]
    batch = greedy_batch(4)
    add_processors(batch, rows, params, VOCAB)
    out = sample(logits, batch).token_ids
    ref = logits.clone()
    ref[0, 7] += 50.0
    ref[0, 9] -= 3.0
    keep = torch.full((VOCAB,), float("-inf"))
    keep[[3, 4, 5]] = 0
    ref[1] += keep
    for ids in bad_words_token_ids(["def"], tokenizer):
        if len(ids) == 1:
            ref[3, ids[0]] = float("-inf")
    assert out.tolist() == ref.argmax(-1).tolist()
    assert out[2] == logits[2].argmax()  # the ordinary row is untouched


def test_multi_token_bad_word_bans_only_after_its_prefix(tokenizer: object) -> None:
    p = SamplingParams(temperature=0, bad_words=["fibonacci"])
    prepare_params(p, tokenizer, VOCAB, [1])
    word = max(p.bad_words_token_ids, key=len)
    assert len(word) > 1
    logits = torch.zeros(2, VOCAB)
    logits[:, word[-1]] = 10.0  # the word's last token is the favourite
    batch = greedy_batch(2)
    add_processors(batch, [Row(list(word[:-1])), Row([2])], [p, p], VOCAB)
    out = sample(logits, batch).token_ids.tolist()
    assert out[0] != word[-1] and out[1] == word[-1]


def test_no_processor_no_tensors() -> None:
    batch = greedy_batch(2)
    add_processors(batch, [Row(), Row()], [SamplingParams(), SamplingParams()], VOCAB)
    assert batch.blocked is None and batch.bias_rows is None


def test_grammar_mask_follows_the_tokens_sampled(tokenizer: object) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    p = SamplingParams(temperature=1.0, seed=1,
                       structured_outputs=StructuredOutputsParams(json=schema))
    prepare_params(p, tokenizer, VOCAB, [1])
    row, ordinary = Row(), Row()
    plain = SamplingParams(temperature=0)
    torch.manual_seed(0)
    for _ in range(40):
        logits = torch.randn(2, VOCAB)
        batch = SamplingBatch(torch.tensor([1.0, 0.0]), None, None, None,
                              torch.tensor([False, False]), torch.zeros(2, dtype=torch.long))
        add_processors(batch, [row, ordinary], [p, plain], VOCAB)
        assert batch.blocked is not None and not batch.blocked[1].any()
        token = int(sample(logits, batch).token_ids[0])
        if token == 1:  # EOS: only allowed once the object is complete
            break
        row.output_token_ids.append(token)
    text = tokenizer.decode(row.output_token_ids)  # type: ignore[attr-defined]
    assert json.loads(text) in ({"ok": True}, {"ok": False})


def test_bitmask_unpacking() -> None:
    bits = torch.zeros(1, 2, dtype=torch.int32)
    bits[0, 0] = 1 | (1 << 5)
    bits[0, 1] = -(1 << 31)  # bit 31 of word 1: token 63
    mask = bitmask_to_bool(bits, 64)
    assert mask[0].nonzero().flatten().tolist() == [0, 5, 63]


@pytest.mark.parametrize("spec,needle", [
    ({"regex": "(["}, "regex"), ({"json": "{not json"}, "invalid"),
    ({"grammar": "start: ("}, "grammar"), ({"choice": []}, "choice"),
])
def test_invalid_grammars_are_request_errors(spec: dict, needle: str) -> None:
    from glowlm.sampling.structured import grammar_of

    with pytest.raises(RequestError, match=needle):
        grammar_of(StructuredOutputsParams(**spec))


def test_token_ids_checked_against_the_vocabulary(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="logit_bias"):
        SamplingParams(logit_bias={VOCAB: 1.0}).check_vocab(VOCAB)
    with pytest.raises(RequestError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[VOCAB + 5]).check_vocab(VOCAB)
