"""Tiny random Hugging Face checkpoints of every supported architecture.

Seeded, built from transformers configs and saved with ``save_pretrained``, with
a small byte-level BPE tokenizer trained on a fixed text, so tests compare
glowlm against transformers on real checkpoints without any download.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 384
#: Architectures whose layers the platforms' fused decoder ops cover (their tests ask for them).
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "opt", "gpt2")
#: Every tiny architecture: Gemma 3 runs its modules or a platform's own decoder ops
#: (glowlm/models/gemma3.py); the tiny Granite's multipliers keep its layers on their
#: modules (glowlm/models/granite.py), and so do SmolLM3's layers without rotary and
#: OLMo 2's post-branch norms.
ALL_ARCHITECTURES = (*ARCHITECTURES, "gemma3", "granite", "smollm3", "olmo2", "phi3", "gemma2",
                     "starcoder2")
#: Long-context checkpoints (glowlm/layers/rope_scaling.py), each trained on
#: ``LONG_TRAINED`` positions and scaled to serve ``LONG_SERVED``: Llama with Llama 3.1's,
#: linear and dynamic NTK scaling, Qwen2 with YaRN; the tiny Phi-3 has LongRoPE.
LONG_CONTEXT = ("llama3_long", "llama_linear", "llama_dynamic", "qwen2_yarn", "phi3")
LONG_TRAINED, LONG_SERVED = 256, 4096
#: The tiny Phi-3's and Starcoder2's window over every layer.
WINDOW = 48
#: Mixture-of-experts checkpoints (glowlm/models/moe.py): 8 experts, 2 per token.
MOE_ARCHITECTURES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")
#: The tiny Gemma 3's local layers' window: prompts of a few dozen tokens outrun it,
#: and it does not divide the 32-token blocks, so windows start mid-block.
GEMMA3_WINDOW = 12

_TEXT = """def fibonacci(n):
    \"\"\"Return the n-th Fibonacci number.\"\"\"
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Greeter:
    def hello(self, name: str) -> str:
        return f"Hello, {name}! 你好，世界 🌍 café naïve"
""" * 3


def _tokenizer(out: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([_TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}# assistant:{% endif %}")
    fast.save_pretrained(out)
    return fast


def hf_config(arch: str, **overrides: Any) -> Any:
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    llama_like = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      **common)
    if arch == "llama":
        cfg = tf.LlamaConfig(**llama_like, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256})
    elif arch == "mistral":
        cfg = tf.MistralConfig(**llama_like, sliding_window=None)
    elif arch == "qwen2":
        cfg = tf.Qwen2Config(**llama_like, tie_word_embeddings=True)
    elif arch == "qwen3":
        cfg = tf.Qwen3Config(**llama_like, head_dim=32)
    elif arch == "opt":
        cfg = tf.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=1024,
                           word_embed_proj_dim=64, **common)
    elif arch == "gpt2":
        cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=1024, **common)
    elif arch == "gemma3":
        # Local, local, global, local: the last layer (pruned prefill) is windowed; head_dim
        # and query_pre_attn_scalar differ from hidden/heads, global rope is scaled.
        cfg = tf.Gemma3TextConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
            max_position_embeddings=1024, sliding_window=GEMMA3_WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
            rope_scaling={"rope_type": "linear", "factor": 2.0}, **common)
        cfg.architectures = ["Gemma3ForCausalLM"]
    elif arch == "granite":
        # Every multiplier away from 1 (and the attention scale from head_dim ** -0.5), so
        # a missing one changes the tokens; untied head, biased attention.
        cfg = tf.GraniteConfig(**llama_like, tie_word_embeddings=False, attention_bias=True,
                               embedding_multiplier=3.0, residual_multiplier=0.5,
                               attention_multiplier=0.2, logits_scaling=1.5)
    elif arch == "smollm3":
        # Four layers, the last without rotary (the pruned prefill's layer); tied head.
        cfg = tf.SmolLM3Config(**{**llama_like, "num_hidden_layers": 4},
                               tie_word_embeddings=True)
    elif arch == "olmo2":
        cfg = tf.Olmo2Config(**llama_like, tie_word_embeddings=False)
    elif arch == "qwen3_moe":
        # Three layers, the middle one dense (mlp_only_layers); top-k renormalized.
        cfg = tf.Qwen3MoeConfig(**{**llama_like, "num_hidden_layers": 3}, head_dim=16,
                                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                                mlp_only_layers=[1], norm_topk_prob=True,
                                tie_word_embeddings=False)
    elif arch == "qwen2_moe":
        # A shared expert with its gate; top-k not renormalized (Qwen2-MoE's default).
        cfg = tf.Qwen2MoeConfig(**llama_like, num_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                norm_topk_prob=False, tie_word_embeddings=False)
    elif arch == "mixtral":
        cfg = tf.MixtralConfig(**{**llama_like, "intermediate_size": 32}, num_local_experts=8,
                               num_experts_per_tok=2, sliding_window=None,
                               tie_word_embeddings=False)
    elif arch == "olmoe":
        cfg = tf.OlmoeConfig(**{**llama_like, "intermediate_size": 32}, num_experts=8,
                             num_experts_per_tok=2, norm_topk_prob=False,
                             tie_word_embeddings=False)
    elif arch == "phi3":
        # LongRoPE on half of each head (Phi-4-mini's partial rotary), a window on every
        # layer, untied head; factors differ per frequency and between the two sets.
        half = (llama_like["hidden_size"] // llama_like["num_attention_heads"]) // 4
        cfg = tf.Phi3Config(**{**llama_like, "max_position_embeddings": LONG_SERVED},
                            original_max_position_embeddings=LONG_TRAINED,
                            partial_rotary_factor=0.5, sliding_window=WINDOW,
                            tie_word_embeddings=False, rope_scaling={
                                "rope_type": "longrope",
                                "short_factor": [1.0 + 0.25 * i for i in range(half)],
                                "long_factor": [1.0 + 4.0 * i for i in range(half)]})
    elif arch == "gemma2":
        # Gemma 3's tiny shape with Gemma 2's alternating windows; caps low enough to bite.
        cfg = tf.Gemma2Config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
            max_position_embeddings=1024, sliding_window=GEMMA3_WINDOW,
            attn_logit_softcapping=4.0, final_logit_softcapping=30.0, **common)
    elif arch == "starcoder2":
        cfg = tf.Starcoder2Config(**llama_like, sliding_window=WINDOW, use_bias=True,
                                  tie_word_embeddings=True)
    elif arch in LONG_CONTEXT:
        cfg = _long_context(tf, arch, llama_like)
    else:
        raise ValueError(f"unknown tiny architecture {arch!r}; use one of "
                         f"{ALL_ARCHITECTURES + MOE_ARCHITECTURES + LONG_CONTEXT}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def _long_context(tf: Any, arch: str, llama_like: dict[str, Any]) -> Any:
    """The long-context tiny configs: ``LONG_TRAINED`` positions scaled by 16."""
    served = {**llama_like, "max_position_embeddings": LONG_SERVED}
    if arch == "llama3_long":
        return tf.LlamaConfig(**served, tie_word_embeddings=False, rope_scaling={
            "rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": LONG_TRAINED})
    trained = {**llama_like, "max_position_embeddings": LONG_TRAINED}
    if arch == "llama_linear":
        return tf.LlamaConfig(**trained, tie_word_embeddings=False,
                              rope_scaling={"rope_type": "linear", "factor": 16.0})
    if arch == "llama_dynamic":
        return tf.LlamaConfig(**trained, tie_word_embeddings=False,
                              rope_scaling={"rope_type": "dynamic", "factor": 16.0})
    # Qwen2.5's layout: YaRN from the original length (beta and truncation defaults).
    return tf.Qwen2Config(**served, tie_word_embeddings=True, rope_scaling={
        "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": LONG_TRAINED})


def make_tiny_model(arch: str, out: str | Path, seed: int = 0,
                    dtype: torch.dtype = torch.float32, **overrides: Any) -> Path:
    """Write a seeded tiny ``arch`` checkpoint with tokenizer to ``out``; return the path."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _tokenizer(out)
    cfg = hf_config(arch, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    # Random init gives near-uniform logits; widen them so greedy ties are rare.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
            elif arch in ("gemma3", "gemma2") and "norm" in name:
                # Gemma norms scale by 1 + w and start at w = 0; random w tests the 1.
                p.normal_(0.0, 0.5)
            elif arch in ("olmo2", "olmoe") and "norm" in name:
                # OLMo 2's q/k norms span all heads: random w shows a per-head norm.
                p.uniform_(0.5, 1.5)
            elif arch == "starcoder2":
                # LayerNorm weights away from 1, every bias away from 0.
                p.uniform_(0.5, 1.5) if "norm" in name and name.endswith("weight") \
                    else p.normal_(0.0, 0.05)
    model.save_pretrained(out)
    return out


#: Engine settings for tests: little KV cache (paging is exercised), no progress bars.
SMALL_ENGINE: dict[str, Any] = dict(kv_cache_space_gib=0.02, block_size=32, show_progress=False)
