"""BERT-family GGUF files (llama.cpp's ``bert`` architecture) as a model directory.

transformers reads no BERT GGUF, so glowlm converts the metadata itself, from the keys
llama.cpp's converter writes: the ``bert.*`` hyper-parameters become a ``BertConfig``;
the WordPiece vocabulary, which the converter stores in "phantom space" form (a word
start as ``▁word``, a continuation ``##piece`` as ``piece``, ``[CLS]``-style specials as
they are), becomes a ``vocab.txt`` again for ``BertTokenizerFast`` (lower-cased, as
llama.cpp's WPM tokenizer always is); and ``bert.pooling_type`` (mean / CLS / last)
becomes a sentence-transformers ``modules.json`` with a Normalize module, so the pooling
engine pools as the file says (llama.cpp normalizes embeddings by default too). A
classifier head (``cls`` + ``cls.output``, pooling type RANK) makes the file a
``BertForSequenceClassification``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glowlm.errors import ModelLoadError
from glowlm.model_loader.gguf import GGUFInfo, field

#: llama.cpp's pooling types (gguf.PoolingType): NONE, MEAN, CLS, LAST, RANK.
_POOLING = {1: "mean", 2: "cls", 3: "lasttoken", 4: "cls"}
_PHANTOM = "\u2581"


def wordpiece_vocab(tokens: list[str]) -> list[str]:
    """Undo the converter's phantom-space spelling: ``▁word`` -> ``word``, ``piece`` ->
    ``##piece``, ``[SPECIAL]`` unchanged."""
    out = []
    for tok in tokens:
        if tok.startswith(_PHANTOM):
            out.append(tok[1:])
        elif tok.startswith("[") and tok.endswith("]"):
            out.append(tok)
        else:
            out.append("##" + tok)
    return out


def _shape(reader: Any, name: str) -> tuple[int, ...] | None:
    for t in reader.tensors:
        if t.name == name:
            return tuple(int(x) for x in reversed(t.shape.tolist()))
    return None


def convert_bert(path: Path, info: GGUFInfo, reader: Any, out: Path) -> None:
    """Write ``config.json``, the tokenizer and the pooling layout of ``path`` into ``out``."""
    from transformers import BertConfig, BertTokenizerFast

    def need(key: str) -> Any:
        value = field(reader, f"bert.{key}")
        if value is None:
            raise ModelLoadError(f"{path}: the GGUF metadata lacks bert.{key}")
        return value

    if field(reader, "tokenizer.ggml.model") != "bert":
        raise ModelLoadError(f"{path}: a bert GGUF needs the WordPiece ('bert') tokenizer, "
                             f"got {field(reader, 'tokenizer.ggml.model')!r}")
    if any(t.name.endswith(".attn_qkv.weight") for t in reader.tensors):
        raise ModelLoadError(f"{path}: fused attn_qkv tensors (NomicBERT-style) are not "
                             "supported in bert GGUF files")
    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens", [])]
    types = _shape(reader, "token_types.weight")
    labels = _shape(reader, "cls.output.weight")
    config = BertConfig(
        vocab_size=len(tokens), hidden_size=int(need("embedding_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=int(need("attention.head_count")),
        intermediate_size=int(need("feed_forward_length")),
        max_position_embeddings=int(need("context_length")),
        layer_norm_eps=float(field(reader, "bert.attention.layer_norm_epsilon", 1e-12)),
        type_vocab_size=types[0] if types else 2, hidden_act="gelu",
        pad_token_id=int(field(reader, "tokenizer.ggml.padding_token_id", 0) or 0),
        num_labels=labels[0] if labels else 2)
    raw = config.to_dict()
    raw["architectures"] = [info.hf_architecture]
    raw["torch_dtype"] = "float32" if info.quantized else (
        "bfloat16" if "BF16" in info.tensor_types else
        "float16" if "F16" in info.tensor_types else "float32")
    (out / "config.json").write_text(json.dumps(raw, indent=2, default=str))
    words = wordpiece_vocab(tokens)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True,
                      model_max_length=config.max_position_embeddings).save_pretrained(out)
    (out / "generation_config.json").write_text("{}")
    pooling = _POOLING.get(int(field(reader, "bert.pooling_type", 2) or 0))
    if pooling is not None and labels is None:
        (out / "1_Pooling").mkdir()
        (out / "1_Pooling" / "config.json").write_text(json.dumps(
            {"embedding_dimension": config.hidden_size, "pooling_mode": pooling}))
        (out / "2_Normalize").mkdir()
        (out / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.Normalize"}]))
    (out / "gguf_source.json").write_text(json.dumps({
        "file": str(path), "architecture": info.architecture, "name": info.name,
        "tensor_types": info.tensor_types}, indent=2))
