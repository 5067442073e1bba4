"""A sentence-transformers directory's pipeline: pooling, Dense projections, Normalize.

sentence-transformers saves a model as ``modules.json`` listing its modules in order
(``Transformer`` at the root, then ``1_Pooling``, optionally ``2_Dense`` and
``3_Normalize``), each a folder with its own ``config.json``. How the checkpoint pools
is written there and nowhere else: serving a BERT embedder with CLS pooling when it
was trained with mean pooling gives plausible-looking but wrong vectors, so the
pooling engine reads this layout and uses it unless ``--pooler-config`` says otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from glowlm.errors import ModelLoadError
from glowlm.layers.pooler import DenseLayer

_POOLING_KEYS = (("pooling_mode_cls_token", "CLS"), ("pooling_mode_mean_tokens", "MEAN"),
                 ("pooling_mode_lasttoken", "LAST"))
_POOLING_NAMES = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST", "last": "LAST"}


@dataclass
class SentenceTransformerLayout:
    """What the directory's modules say; None: the directory does not say."""

    pooling_type: str | None = None
    normalize: bool = False
    dense: list[DenseLayer] = field(default_factory=list)
    #: ``sentence_bert_config.json``'s ``max_seq_length`` (the length it was trained at)
    max_seq_length: int | None = None


def _json(path: Path) -> dict:  # type: ignore[type-arg]
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc})") from None


def _pooling_type(path: Path) -> str:
    cfg = _json(path / "config.json")
    mode = cfg.get("pooling_mode")  # sentence-transformers 6: one name
    if isinstance(mode, str):
        kind = _POOLING_NAMES.get(mode.lower())
        if kind is None:
            raise ModelLoadError(f"{path}/config.json: pooling_mode {mode!r} is not supported "
                                 "(cls, mean, lasttoken)")
        return kind
    modes = [kind for key, kind in _POOLING_KEYS if cfg.get(key)]
    unsupported = [k for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                               "pooling_mode_weightedmean_tokens") if cfg.get(k)]
    if unsupported or len(modes) != 1:
        raise ModelLoadError(f"{path}/config.json: pooling {unsupported or modes or 'none'} is "
                             "not supported (one of CLS, mean, last token)")
    if cfg.get("include_prompt", True) is False:
        raise ModelLoadError(f"{path}/config.json: include_prompt=false is not supported")
    return modes[0]


def _dense(path: Path) -> DenseLayer:
    cfg = _json(path / "config.json")
    weights = path / "model.safetensors"
    if weights.exists():
        from safetensors.torch import load_file

        state = load_file(str(weights))
    elif (path / "pytorch_model.bin").exists():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelLoadError(f"{path}: the Dense module has no model.safetensors")
    weight = state.get("linear.weight")
    if weight is None or tuple(weight.shape) != (cfg["out_features"], cfg["in_features"]):
        raise ModelLoadError(f"{path}: linear.weight is missing or not "
                             f"{cfg['out_features']} x {cfg['in_features']}")
    return DenseLayer(weight.float(), state.get("linear.bias"),
                      cfg.get("activation_function", "torch.nn.modules.linear.Identity"))


def read_layout(model_dir: Path) -> SentenceTransformerLayout | None:
    """The directory's sentence-transformers pipeline, or None if it is not one."""
    modules_file = model_dir / "modules.json"
    if not modules_file.exists():
        return None
    modules = json.loads(modules_file.read_text())
    layout = SentenceTransformerLayout()
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        path = model_dir / module.get("path", "")
        if kind == "Transformer":
            if module.get("path", "") not in ("", "."):
                raise ModelLoadError(f"{modules_file}: the Transformer module must be the "
                                     "directory itself (path '')")
        elif kind == "Pooling":
            layout.pooling_type = _pooling_type(path)
        elif kind == "Dense":
            if layout.normalize:
                raise ModelLoadError(f"{modules_file}: a Dense module after Normalize is not "
                                     "supported (Dense modules run before the norm)")
            layout.dense.append(_dense(path))
        elif kind == "Normalize":
            layout.normalize = True
        else:
            raise ModelLoadError(f"{modules_file}: module {module.get('type')!r} is not "
                                 "supported (Transformer, Pooling, Dense, Normalize)")
    bert_cfg = model_dir / "sentence_bert_config.json"
    if bert_cfg.exists():
        length = _json(bert_cfg).get("max_seq_length")
        layout.max_seq_length = int(length) if length else None
    return layout
