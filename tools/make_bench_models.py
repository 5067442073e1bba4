"""Write the benchmark checkpoints (``make bench-models``): real model shapes, seeded weights.

No hub is reachable and speed does not depend on weight values, so the models
the benchmarks run (docs/performance.md) are seeded random initialisations of
real shapes, saved in Hugging Face format (bf16 safetensors, config, tokenizer)
with one byte-level BPE tokenizer of 32000 tokens trained on this Python's
standard library:

- ``llama-1b-rand``: the shape of Llama-3.2-1B (hidden 2048, 16 layers, 32
  heads, 8 KV heads, intermediate 8192, tied embeddings, rope theta 500000),
  1.04 B parameters, ~2.1 GB;
- ``opt-125m-rand``: the shape of OPT-125m;
- ``qwen3-moe-rand``: a Qwen3-MoE shape (hidden 1024, 16 layers, 16 query / 4 KV heads
  of 64, 64 experts of intermediate 256, 8 routed per token, q/k norm), ~0.9 B
  parameters of which ~0.18 B are active per token;
- ``bert-base-st-rand``: a BERT-base embedding model (hidden 768, 12 layers, 12 heads,
  intermediate 3072, 512 positions; bge-base / e5-base shape, 109 M parameters) as a
  sentence-transformers directory (mean pooling, Normalize), saved by
  sentence-transformers itself, for ``glowlm bench embed``.

Everything comes from fixed seeds and this interpreter's standard library, so
the same Python and library versions give the same files. Weights are random:
benchmarks force the output length (``ignore_eos``). A model directory that
already has a ``config.json`` is left alone (delete it to remake it).

Usage: python tools/make_bench_models.py OUT_DIR [--only NAME ...]
       python tools/make_bench_models.py OUT_DIR --smoke   (2-layer shapes, 512
       tokens: the same files in seconds, for the test of this script)
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

VOCAB = 32000
SPECIAL = ["<s>", "</s>", "<unk>"]  # ids 0, 1, 2: bos, eos/pad, unk


def stdlib_sources() -> Iterator[str]:
    """The tokenizer's training text: every readable .py file of the standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def train_tokenizer(out: Path, vocab_size: int, limit_files: int | None) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style), saved once in ``out`` and reused."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not (out / "tokenizer.json").exists():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        texts = stdlib_sources()
        if limit_files is not None:
            texts = (t for i, t in zip(range(limit_files), texts, strict=False))
        tok.train_from_iterator(texts, trainer)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[0],
                                       eos_token=SPECIAL[1], unk_token=SPECIAL[2])
        fast.save_pretrained(out)
    return PreTrainedTokenizerFast.from_pretrained(out)


def llama_1b(vocab: int, smoke: bool) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8)
    if smoke:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(LlamaConfig(
        **shape, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=True,
        vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=1))


def opt_125m(vocab: int, smoke: bool) -> Any:
    from transformers import OPTConfig, OPTForCausalLM

    shape = dict(hidden_size=768, ffn_dim=3072, num_hidden_layers=12, num_attention_heads=12,
                 word_embed_proj_dim=768)
    if smoke:
        shape = dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                     word_embed_proj_dim=64)
    return OPTForCausalLM(OPTConfig(
        **shape, max_position_embeddings=2048, vocab_size=vocab, bos_token_id=0,
        eos_token_id=1, pad_token_id=1))


def qwen3_moe(vocab: int, smoke: bool) -> Any:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape = dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=4, head_dim=64, num_experts=64, moe_intermediate_size=256,
                 num_experts_per_tok=8, intermediate_size=3072)
    if smoke:
        shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=8,
                     moe_intermediate_size=32, num_experts_per_tok=2, intermediate_size=128)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **shape, max_position_embeddings=8192, rope_theta=1000000.0, norm_topk_prob=True,
        tie_word_embeddings=False, vocab_size=vocab, bos_token_id=0, eos_token_id=1,
        pad_token_id=1))


def bert_base(vocab: int, smoke: bool) -> Any:
    from transformers import BertConfig, BertModel

    shape = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
    if smoke:
        shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128)
    return BertModel(BertConfig(**shape, max_position_embeddings=512, vocab_size=vocab,
                                type_vocab_size=2, pad_token_id=1), add_pooling_layer=False)


def _as_sentence_transformer(target: Path) -> None:
    """Rewrite ``target`` (a saved encoder) as sentence-transformers saves an embedder:
    modules.json, 1_Pooling (mean), 2_Normalize."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    tok.pad_token = SPECIAL[1]  # batches of several lengths pad with </s> (pad_token_id 1)
    tok.save_pretrained(target)
    word = models.Transformer(str(target), max_seq_length=512)
    dim = int(word.auto_model.config.hidden_size)
    SentenceTransformer(modules=[word, models.Pooling(dim, pooling_mode="mean"),
                                 models.Normalize()], device="cpu").save(str(target))


MODELS: dict[str, Callable[[int, bool], Any]] = {"llama-1b-rand": llama_1b,
                                                  "opt-125m-rand": opt_125m,
                                                  "qwen3-moe-rand": qwen3_moe,
                                                  "bert-base-st-rand": bert_base}
#: sentence-transformers directories (written by :func:`_as_sentence_transformer`)
EMBEDDERS = {"bert-base-st-rand"}
#: What ``make bench-models`` writes; the MoE shape is made by the MoE benchmarks only,
#: the embedder by ``glowlm bench embed``'s users.
DEFAULT = ["llama-1b-rand", "opt-125m-rand"]


def make(out: Path, names: list[str], smoke: bool = False) -> list[Path]:
    """Write the named models (and the shared tokenizer) under ``out``; returns their dirs."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    vocab = 512 if smoke else VOCAB
    tokenizer = train_tokenizer(out / "tokenizer", vocab, 200 if smoke else None)
    made = []
    for name in names:
        target = out / name
        made.append(target)
        if (target / "config.json").exists():
            print(f"{target}: already there")
            continue
        torch.manual_seed(0)  # each model from the same seed, whatever else was made
        model = MODELS[name](len(tokenizer), smoke).to(torch.bfloat16)
        model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
        if name in EMBEDDERS:
            _as_sentence_transformer(target)
        params = sum(p.numel() for p in model.parameters())
        print(f"{target}: {params / 1e6:.1f} M parameters, bf16")
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="directory to write the models into")
    p.add_argument("--only", nargs="+", choices=sorted(MODELS), default=DEFAULT,
                   help=f"make only these models (default: {' '.join(DEFAULT)})")
    p.add_argument("--smoke", action="store_true",
                   help="2-layer shapes and a 512-token vocabulary (tests of this script)")
    args = p.parse_args(argv)
    make(args.out, args.only, args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
