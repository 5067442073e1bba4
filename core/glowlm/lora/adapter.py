"""Read a LoRA adapter into per-module low-rank pairs, checked before anything is loaded.

Two formats:

- a PEFT directory: ``adapter_config.json`` (``r``, ``lora_alpha``, ``use_rslora``,
  ``rank_pattern`` / ``alpha_pattern``, ``modules_to_save``...) and
  ``adapter_model.safetensors``, keys ``base_model.model.<module>.lora_A.weight`` /
  ``.lora_B.weight``;
- a llama.cpp GGUF LoRA file (``general.type = adapter``, ``adapter.lora.alpha``,
  tensors ``blk.N.<name>.weight.lora_a`` / ``.lora_b``), named back to the Hugging Face
  modules the way the model loader names a GGUF model's tensors, with the converter's
  Llama q/k row permutation undone on B.

The result names modules as the base checkpoint does (``model.layers.0.self_attn.q_proj``);
:mod:`glowlm.lora.slots` maps them onto the model's (possibly fused) linear layers. The
scale (``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA) is folded into B once here, in
fp32, so a layer runs two matmuls and an add. Anything an adapter asks for that glowlm
does not run (DoRA, trained biases, ``modules_to_save``, embedding or LM-head targets) is
refused with one line naming it: a silently dropped part would serve different outputs.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from glowlm.errors import LoRAError
from glowlm.lora.weights import LoRAAdapter, LoRAPair

_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])\.weight$")
_GGUF_KEY = re.compile(r"^(.+\.weight)\.lora_([ab])$")


def read_adapter(path: str | Path) -> LoRAAdapter:
    """The adapter at ``path`` (a PEFT directory or a ``.gguf`` file); LoRAError if it
    cannot be served as it is."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LoRAError(f"LoRA adapter {str(path)!r} does not exist")
    if p.is_file():
        if p.suffix == ".gguf":
            return _read_gguf(p)
        raise LoRAError(f"LoRA adapter {str(path)!r} is a file but not a .gguf one: give a "
                        "PEFT directory (adapter_config.json + adapter_model.safetensors) or "
                        "a llama.cpp GGUF LoRA file")
    ggufs = sorted(p.glob("*.gguf"))
    if not (p / "adapter_config.json").exists():
        if len(ggufs) == 1:
            return _read_gguf(ggufs[0])
        raise LoRAError(f"LoRA adapter {str(path)!r}: no adapter_config.json (a PEFT adapter "
                        "directory has adapter_config.json and adapter_model.safetensors)")
    return _read_peft(p)


# -- PEFT ---------------------------------------------------------------------------


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's ``rank_pattern`` / ``alpha_pattern`` lookup: a key matches the module's
    name or a dotted suffix of it."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _read_peft(p: Path) -> LoRAAdapter:
    where = str(p)
    try:
        config = json.loads((p / "adapter_config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoRAError(f"LoRA adapter {where!r}: adapter_config.json is not readable JSON "
                        f"({exc})") from None
    if not isinstance(config, dict):
        raise LoRAError(f"LoRA adapter {where!r}: adapter_config.json is not a JSON object")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoRAError(f"LoRA adapter {where!r} is a {peft_type} adapter; glowlm serves LORA "
                        "adapters only")
    if config.get("use_dora"):
        raise LoRAError(f"LoRA adapter {where!r} uses DoRA (use_dora), which glowlm does not "
                        "run; merge it into the base model instead")
    if config.get("modules_to_save"):
        raise LoRAError(f"LoRA adapter {where!r} saves whole modules "
                        f"(modules_to_save={config['modules_to_save']}), which a shared base "
                        "model cannot serve; train without them or merge the adapter")
    if str(config.get("bias", "none")) != "none" or config.get("lora_bias"):
        raise LoRAError(f"LoRA adapter {where!r} trains biases (bias="
                        f"{config.get('bias')!r}), which glowlm does not apply")
    try:
        r = int(config["r"])
        alpha = float(config.get("lora_alpha", r))
    except (KeyError, TypeError, ValueError):
        raise LoRAError(f"LoRA adapter {where!r}: adapter_config.json needs an integer 'r' "
                        "and a number 'lora_alpha'") from None
    rslora = bool(config.get("use_rslora", False))
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    weights = p / "adapter_model.safetensors"
    if not weights.exists():
        hint = (" (adapter_model.bin is a pickle, which glowlm does not load: save the "
                "adapter with safe_serialization=True)"
                if (p / "adapter_model.bin").exists() else "")
        raise LoRAError(f"LoRA adapter {where!r}: no adapter_model.safetensors{hint}")
    from safetensors import SafetensorError, safe_open

    pairs: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                m = _PEFT_KEY.match(key)
                if m is None:
                    raise LoRAError(_unsupported_tensor(where, key))
                pairs.setdefault(m.group(1), {})[m.group(2)] = f.get_tensor(key)
    except SafetensorError as exc:
        raise LoRAError(f"LoRA adapter {where!r}: adapter_model.safetensors is broken "
                        f"({exc})") from None
    adapter = LoRAAdapter(where, base_model=config.get("base_model_name_or_path"))
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise LoRAError(f"LoRA adapter {where!r}: module {module!r} has lora_"
                            f"{''.join(ab)} but not both lora_A and lora_B")
        mr = int(_pattern_value(rank_pattern, module, r))
        ma = float(_pattern_value(alpha_pattern, module, alpha))
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise LoRAError(f"LoRA adapter {where!r}: module {module!r} has lora_A "
                            f"{tuple(a.shape)} and lora_B {tuple(b.shape)}, which do not "
                            "compose (A is [r, in], B is [out, r])")
        if a.shape[0] != mr:
            raise LoRAError(f"LoRA adapter {where!r}: module {module!r} has rank "
                            f"{a.shape[0]} but adapter_config.json says r={mr}")
        scale = ma / math.sqrt(mr) if rslora else ma / mr
        adapter.modules[module] = LoRAPair(a.float().contiguous(), (b.float() * scale)
                                           .contiguous())
    if not adapter.modules:
        raise LoRAError(f"LoRA adapter {where!r} holds no lora_A/lora_B tensors")
    return adapter


def _unsupported_tensor(where: str, key: str) -> str:
    if "lora_embedding" in key:
        return (f"LoRA adapter {where!r} adapts an embedding ({key}); glowlm adapts linear "
                "projections only")
    if "lora_magnitude" in key:
        return f"LoRA adapter {where!r} is a DoRA adapter ({key}), which glowlm does not run"
    return f"LoRA adapter {where!r}: tensor {key!r} is not a lora_A/lora_B weight"


# -- llama.cpp GGUF -----------------------------------------------------------------


def _read_gguf(p: Path) -> LoRAAdapter:
    """A GGUF LoRA file as llama.cpp's converter writes it."""
    import numpy as np

    from glowlm.model_loader.gguf import _reader, field, hf_name
    from glowlm.model_loader.gguf_weights import _rows

    where = str(p)
    try:
        reader = _reader(p)
    except Exception as exc:  # noqa: BLE001 - gguf raises bare ValueError/struct errors
        raise LoRAError(f"LoRA adapter {where!r} is not a readable GGUF file ({exc})") from None
    kind, adapter_type = field(reader, "general.type"), field(reader, "adapter.type")
    if kind != "adapter" or adapter_type != "lora":
        raise LoRAError(f"{where!r} is a GGUF {kind or 'model'} file, not a LoRA adapter "
                        "(general.type adapter, adapter.type lora)")
    arch = str(field(reader, "general.architecture", "llama"))
    alpha = field(reader, "adapter.lora.alpha")
    n_head = int(field(reader, f"{arch}.attention.head_count", 0) or 0)
    n_kv = int(field(reader, f"{arch}.attention.head_count_kv", n_head) or n_head)
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for t in reader.tensors:
        m = _GGUF_KEY.match(t.name)
        if m is None:
            raise LoRAError(f"LoRA adapter {where!r}: tensor {t.name!r} is not a "
                            "<name>.weight.lora_a / .lora_b pair")
        name = hf_name(arch, m.group(1))
        if name is None or ".layers." not in name:
            raise LoRAError(f"LoRA adapter {where!r}: tensor {t.name!r} adapts a module "
                            "glowlm does not adapt (linear projections of the layers only)")
        if t.tensor_type.name not in ("F32", "F16", "BF16"):
            raise LoRAError(f"LoRA adapter {where!r}: tensor {t.name!r} is "
                            f"{t.tensor_type.name}; LoRA files are read in F32/F16/BF16")
        shape = tuple(int(d) for d in reversed(t.shape))
        data = np.asarray(t.data)
        if t.tensor_type.name == "BF16":
            w = torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16).float()
        else:
            w = torch.from_numpy(np.array(data, dtype=np.float32))
        halves.setdefault(name.removesuffix(".weight"), {})[m.group(2)] = w.reshape(shape)
    adapter = LoRAAdapter(where)
    for module, ab in sorted(halves.items()):
        if set(ab) != {"a", "b"}:
            raise LoRAError(f"LoRA adapter {where!r}: module {module!r} lacks lora_a or lora_b")
        a, b = ab["a"], ab["b"]
        if a.shape[0] != b.shape[1]:
            raise LoRAError(f"LoRA adapter {where!r}: module {module!r} has lora_a "
                            f"{tuple(a.shape)} and lora_b {tuple(b.shape)}, which do not "
                            "compose")
        rank = int(a.shape[0])
        scale = float(alpha) / rank if alpha else 1.0
        b = _rows(arch, f"{module}.weight", n_head, n_kv, b)
        adapter.modules[module] = LoRAPair(a.contiguous(), (b * scale).contiguous())
    if not adapter.modules:
        raise LoRAError(f"LoRA adapter {where!r} holds no LoRA tensors")
    return adapter
