"""Real PEFT adapters on the tiny checkpoints, and transformers + peft's greedy tokens as
the reference (tests and docs/lora.md).

The adapters are made by ``peft`` itself (``get_peft_model`` + ``save_pretrained``), with
random A and B (``init_lora_weights=False``) scaled up so an adapter's tokens differ from
the base model's: a zero B, as training starts, would prove nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


def make_peft_adapter(base: str | Path, out: str | Path, r: int = 8, alpha: float = 16,
                      targets: Sequence[str] = (*ATTENTION, *MLP), seed: int = 0,
                      use_rslora: bool = False, scale: float = 4.0, **extra: Any) -> Path:
    """Write a PEFT LoRA adapter for the checkpoint ``base`` to ``out``; return ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = Path(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets),
                        init_lora_weights=False, use_rslora=use_rslora, lora_dropout=0.0,
                        **extra)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(scale)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    return out


def peft_greedy(base: str | Path, adapter: str | Path | None, prompts: Sequence[list[int]],
                max_tokens: int, dtype: torch.dtype = torch.float32) -> list[list[int]]:
    """transformers (+ peft when ``adapter`` is given) greedy tokens for each prompt."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=dtype)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    outs = []
    # A plain loop over full forwards: generate() applies the checkpoint's generation
    # config (penalties, processors), which is not the model's own greedy choice.
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(max_tokens):
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
                seq.append(int(logits.argmax()))
            outs.append(seq[len(ids):])
    return outs


def write_gguf_lora(adapter: str | Path, base: str | Path, out: str | Path,
                    dtype: str = "F32") -> Path:
    """The PEFT adapter ``adapter`` (for the checkpoint ``base``) as a llama.cpp GGUF LoRA
    file, written the way llama.cpp's ``convert_lora_to_gguf.py`` writes one: tensors
    ``blk.N.<name>.weight.lora_a`` ([r, in]) / ``.lora_b`` ([out, r]), Llama's q/k rows of B
    permuted as the model converter permutes the weights, ``adapter.lora.alpha``."""
    import json

    import gguf
    import numpy as np
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from glowlm.testing.tiny_gguf import _gguf_name, _permute

    adapter, out = Path(adapter), Path(out)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    hf = AutoConfig.from_pretrained(str(base))
    arch = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}[hf.architectures[0]]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(cfg["lora_alpha"]))
    w.add_uint32(f"{arch}.attention.head_count", hf.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", hf.num_key_value_heads)
    np_dtype = {"F32": np.float32, "F16": np.float16}[dtype]
    for key, t in sorted(load_file(str(adapter / "adapter_model.safetensors")).items()):
        module, half = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        name = _gguf_name(arch, f"{module}.weight")
        assert name is not None, key
        t = t.float()
        if half.startswith("B") and arch == "llama" and module.endswith("q_proj"):
            t = _permute(t, hf.num_attention_heads)
        if half.startswith("B") and arch == "llama" and module.endswith("k_proj"):
            t = _permute(t, hf.num_key_value_heads)
        w.add_tensor(f"{name}.lora_{half[0].lower()}", t.numpy().astype(np_dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
