"""The places a linear choice is installed: every linear layer and the LM head.

Sites of the same shape are measured together and share one
:class:`~glowlm.layers.linear_choice.candidates.ChosenLinearMethod`; a fused decoder
op is kept only for the token classes where every linear it covers chose a
``fused`` candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from glowlm.layers.linear_choice.candidates import (
    TOKEN_CLASSES,
    ChosenLinearMethod,
    TokenClass,
    _ChosenHead,
    _FusedGate,
)
from glowlm.ops.linear import LinearCandidate, is_dense

if TYPE_CHECKING:
    from glowlm.ops.linear import LinearMethod
    from glowlm.platforms.interface import Platform


@dataclass
class _Site:
    module: nn.Module
    method: LinearMethod
    candidates: list[LinearCandidate]
    kind: str                 # "linear" or "lm_head"
    classes: tuple[TokenClass, ...]

    def shape_key(self) -> str:
        w = getattr(self.module, "weight", None)
        if isinstance(self.module, _linear_base()):
            n, k = sum(self.module.output_sizes), self.module.input_size
        else:
            n, k = w.shape  # type: ignore[union-attr]
        # A quantized layer has no dense weight: its activations' (the model's) dtype.
        dt = w.dtype if isinstance(w, torch.Tensor) else getattr(self.module, "params_dtype", None)
        dtype = str(dt).removeprefix("torch.") if dt is not None else "?"
        bias = getattr(self.module, "bias", None) is not None
        names = ",".join(c.name for c in self.candidates)
        return (f"{self.kind}:{type(self.method).__name__}:{n}x{k}:{dtype}:"
                f"bias{int(bias)}:{names}")

    @property
    def in_features(self) -> int:
        if isinstance(self.module, _linear_base()):
            return self.module.input_size
        return self.module.weight.shape[1]


def _linear_base() -> type:
    from glowlm.layers.linear import LinearBase

    return LinearBase


def _candidates(method: LinearMethod, layer: nn.Module, platform: Platform | None
                ) -> list[LinearCandidate]:
    found: list[LinearCandidate] = list(getattr(method, "linear_candidates", lambda _l: [])(layer))
    if platform is not None:
        found += list(getattr(platform, "linear_candidates", lambda _l: [])(layer))
    out: list[LinearCandidate] = []
    for c in found:
        if c.name not in {o.name for o in out} and c.supports(layer):
            out.append(c)
    return out


def find_sites(model: nn.Module, unquantized: LinearMethod | None,
               platform: Platform | None) -> list[_Site]:
    """Every linear layer of ``model``, and its LM head (which computes through the ops
    table's ``dense_linear`` with the platform's unquantized method's candidates)."""
    base = _linear_base()
    sites = []
    for module in model.modules():
        if isinstance(module, base):
            method = module.method
            if isinstance(method, ChosenLinearMethod):
                method = method.inner
            sites.append(_Site(module, method, _candidates(method, module, platform),
                               "linear", TOKEN_CLASSES))
        elif (unquantized is not None and hasattr(module, "compute_logits")
              and hasattr(module, "dense_linear") and is_dense(module)):
            sites.append(_Site(module, unquantized, _candidates(unquantized, module, platform),
                               "lm_head", TOKEN_CLASSES[:-1]))
    return sites


def _groups(sites: Sequence[_Site]) -> dict[str, list[_Site]]:
    groups: dict[str, list[_Site]] = {}
    for s in sites:
        if len(s.candidates) > 1:
            groups.setdefault(s.shape_key(), []).append(s)
    return groups


def _impls(site: _Site, choice: dict[str, str]) -> list[tuple[int | None, LinearCandidate]]:
    by_name = {c.name: c for c in site.candidates}
    out = []
    last = site.candidates[0]
    for cls in TOKEN_CLASSES:
        last = by_name.get(choice.get(cls.name, ""), last)
        out.append((cls.max_rows, last))
    return out


def _install(site: _Site, impls: list[tuple[int | None, LinearCandidate]],
             shared: dict[str, ChosenLinearMethod]) -> None:
    key = site.shape_key()
    method = shared.get(key)
    if method is None:
        method = shared[key] = ChosenLinearMethod(site.method, impls)
    if site.kind == "linear":
        site.module.method = method
    else:
        site.module.dense_linear = _ChosenHead(site.module, method)
    used = {c.name: c for _, c in impls}
    for cand in site.candidates:
        if cand.name not in used and cand.release is not None:
            cand.release(site.module)
        elif cand.name in used and cand.prepare is not None:
            cand.prepare(site.module)
    if len(used) == 1 and site.kind == "linear":  # never on a head tied to the embedding
        only = next(iter(used.values()))
        if only.finalize is not None:
            only.finalize(site.module)


def has_fused_ops(model: nn.Module) -> bool:
    """Whether any fused layer or stack op of the platform runs in ``model``. Encoders
    and platforms without fused ops have none: there, no linear is kept on the fused
    kernel for their sake (:func:`glowlm.layers.linear_choice.keep_fused`)."""
    from glowlm.layers.fused import FusedLayer, FusedStack

    return any(isinstance(obj, FusedLayer | FusedStack) and obj.fn is not None
               for owner in model.modules() for obj in vars(owner).values())


def _gate_fused(model: nn.Module, chosen: dict[int, list[tuple[int | None, LinearCandidate]]]
                ) -> dict[str, list[str]]:
    """Keep each fused op only for the classes where every linear under its owner runs a
    ``fused`` candidate (see the module docstring)."""
    from glowlm.layers.fused import FusedLayer, FusedStack

    base = _linear_base()
    kept: dict[str, list[str]] = {}
    for owner in model.modules():
        for obj in list(vars(owner).values()):
            if not isinstance(obj, FusedLayer | FusedStack) or obj.fn is None:
                continue
            linears = [m for m in owner.modules() if isinstance(m, base)]
            allowed = []
            for i, cls in enumerate(TOKEN_CLASSES):
                if all(id(m) not in chosen or chosen[id(m)][i][1].fused for m in linears):
                    allowed.append(cls.name)
            if len(allowed) < len(TOKEN_CLASSES):
                inner = obj.fn.fn if isinstance(obj.fn, _FusedGate) else obj.fn
                obj.fn = _FusedGate(inner, frozenset(allowed)) if allowed else None
            label = "stack" if isinstance(obj, FusedStack) else "layer"
            prev = kept.get(label)
            kept[label] = allowed if prev is None else [c for c in prev if c in allowed]
    return kept
