"""Tiny random BERT / XLM-RoBERTa / ModernBERT checkpoints, and sentence-transformers
directories.

Seeded transformers models saved with ``save_pretrained`` and a small WordPiece
(BERT: ``[CLS] a [SEP] b [SEP]`` with token types) or BPE tokenizer (XLM-RoBERTa:
``<s> a </s></s> b </s>``, padding id 1; ModernBERT: ``[CLS] a [SEP] b [SEP]``, no token
types), so the pooling tests compare glowlm with transformers and sentence-transformers
without a download. The tiny ModernBERT has a global layer and two local layers with
an 8-token window (4 positions on each side), so ordinary test sentences cross it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

ENCODER_ARCHITECTURES = ("BertModel", "BertForSequenceClassification", "XLMRobertaModel",
                         "XLMRobertaForSequenceClassification", "ModernBertModel",
                         "ModernBertForSequenceClassification")

_WORDS = ("the a an of to in is was for on with as by at from that this it be are or "
          "cat dog fish bird tree house car road city river sun moon star sky rain snow "
          "paris london berlin rome france england germany italy capital country "
          "what where who how why which when is are do does can will red blue green "
          "big small fast slow good bad new old hot cold one two three four five").split()
_TEXT = " ".join(_WORDS) * 4


def _bert_tokenizer(out: Path) -> Any:
    from transformers import BertTokenizerFast

    chars = sorted(set("".join(_WORDS)) | set("0123456789.,?!'-"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS,
             *chars, *(f"##{c}" for c in chars)]
    out.mkdir(parents=True, exist_ok=True)
    words = list(dict.fromkeys(vocab))
    (out / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True)
    tok.save_pretrained(out)
    return tok


def _bpe_tokenizer(out: Path, modern: bool) -> Any:
    """XLM-RoBERTa's ``<s> a </s></s> b </s>`` (padding id 1), or ModernBERT's
    ``[CLS] a [SEP] b [SEP]``, over a small trained BPE."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    cls, pad, sep, unk = (("[CLS]", "[PAD]", "[SEP]", "[UNK]") if modern
                          else ("<s>", "<pad>", "</s>", "<unk>"))
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = [cls, pad, sep, unk] + (["[MASK]"] if modern else [])
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=specials,
                                  show_progress=False)
    tok.train_from_iterator([_TEXT], trainer)
    pair = f"{cls} $A {sep} $B {sep}" if modern else f"{cls} $A {sep} {sep} $B {sep}"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=pair, special_tokens=[(cls, 0), (sep, 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=cls, eos_token=sep,
                                   pad_token=pad, unk_token=unk, cls_token=cls,
                                   sep_token=sep,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(out)
    return fast


def make_tiny_encoder(arch: str, out: str | Path, seed: int = 0, num_labels: int = 1,
                      **overrides: Any) -> Path:
    """A random ``arch`` checkpoint in ``out`` (fp32), with its tokenizer."""
    import transformers

    out = Path(out)
    roberta, modern = arch.startswith("XLMRoberta"), arch.startswith("ModernBert")
    if modern:
        tok = _bpe_tokenizer(out, modern=True)
        cfg_cls = transformers.ModernBertConfig
        settings: dict[str, Any] = dict(
            vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=96, max_position_embeddings=256, local_attention=8,
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            num_labels=num_labels, pad_token_id=1, cls_token_id=0, bos_token_id=0,
            sep_token_id=2, eos_token_id=2, hidden_activation="gelu")
    else:
        tok = _bpe_tokenizer(out, modern=False) if roberta else _bert_tokenizer(out)
        cfg_cls = transformers.XLMRobertaConfig if roberta else transformers.BertConfig
        settings = dict(
            vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=128 + (2 if roberta else 0),
            type_vocab_size=1 if roberta else 2, num_labels=num_labels,
            pad_token_id=1 if roberta else 0, hidden_act="gelu")
    settings.update(overrides)
    config = cfg_cls(**settings)
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    with torch.no_grad():  # wider weights than the default 0.02 init: outputs differ per input
        for name, p in model.named_parameters():
            if "LayerNorm" not in name and "norm" not in name:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out)
    return out


def make_sentence_transformer(out: str | Path, pooling: str = "mean", normalize: bool = True,
                              dense: int | None = None, arch: str = "BertModel",
                              seed: int = 0, base: str | Path | None = None) -> Path:
    """A sentence-transformers directory around a tiny encoder (or the checkpoint
    ``base``: a tiny Qwen3 makes a Qwen3-Embedding-like directory with ``lasttoken``
    pooling), saved by the ``sentence-transformers`` package itself (modules.json,
    1_Pooling, 2_Dense, Normalize)."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer

    out = Path(out)
    if base is None:
        base = make_tiny_encoder(arch, out / "_base", seed)
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None or getattr(tok, "chat_template", None):
        # Batches of several lengths need a pad token (decoder tokenizers), and
        # sentence-transformers 6 renders plain strings through a chat template if the
        # tokenizer has one: embeddings of the text itself are what is compared.
        tok.pad_token = tok.pad_token or tok.eos_token
        tok.chat_template = None
        (Path(base) / "chat_template.jinja").unlink(missing_ok=True)
        tok.save_pretrained(base)
    word = models.Transformer(str(base), max_seq_length=128)
    dim = int(word.auto_model.config.hidden_size)
    modules: list[Any] = [word, models.Pooling(dim, pooling_mode=pooling)]
    if dense is not None:
        torch.manual_seed(seed + 1)
        modules.append(models.Dense(dim, dense, activation_function=torch.nn.Tanh()))
    if normalize:
        modules.append(models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(out / "st"))
    return out / "st"


def write_bert_gguf(model_dir: str | Path, out: str | Path, pooling: str = "MEAN",
                    qtype: str = "F32") -> Path:
    """A tiny BERT checkpoint (``make_tiny_encoder``) as llama.cpp's converter writes it:
    ``bert.*`` keys, the tensor names of gguf's BERT map, the WordPiece vocabulary in
    phantom-space form (``▁word``, ``piece`` for ``##piece``), ``bert.pooling_type``; a
    classifier as ``cls`` (BERT's pooler) + ``cls.output``."""
    import gguf
    from safetensors.torch import load_file

    from glowlm.testing.gguf_blocks import quantize

    model_dir, out = Path(model_dir), Path(out)
    cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(model_dir.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    classifier = "classifier.weight" in load_file(model_dir / "model.safetensors")
    w.add_pooling_type(gguf.PoolingType.RANK if classifier else gguf.PoolingType[pooling])
    vocab = (model_dir / "vocab.txt").read_text().splitlines()
    tokens = [t if t.startswith("[") and t.endswith("]") else
              t[2:] if t.startswith("##") else "\u2581" + t for t in vocab]
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("[") else 1 for t in tokens])
    w.add_token_type_count(cfg["type_vocab_size"])
    for add, token in ((w.add_bos_token_id, "[CLS]"), (w.add_sep_token_id, "[SEP]"),
                       (w.add_pad_token_id, "[PAD]"), (w.add_unk_token_id, "[UNK]"),
                       (w.add_mask_token_id, "[MASK]")):
        add(vocab.index(token))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n)
    for name, t in load_file(model_dir / "model.safetensors").items():
        name = name.removeprefix("bert.")
        if name.startswith("pooler.dense."):  # the classifier's first half: llama.cpp's cls
            gname = "cls." + name.rsplit(".", 1)[1] if classifier else None
        elif name.startswith("classifier."):
            gname = "cls.output." + name.rsplit(".", 1)[1]
        else:
            gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            continue
        data = t.float().numpy()
        if qtype != "F32" and data.ndim == 2 and not gname.startswith(("token", "position")):
            w.add_tensor(gname, quantize(data, qtype), raw_dtype=gguf.GGMLQuantizationType[qtype])
        else:
            w.add_tensor(gname, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
