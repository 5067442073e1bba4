"""RoPE frequency scaling as transformers' ``modeling_rope_utils`` computes it.

A checkpoint's ``rope_scaling`` / ``rope_parameters`` names a ``rope_type``; each type
turns the plain inverse frequencies ``base ** (-2i / dim)`` into scaled ones and may
scale the cos/sin table (the "attention factor": q and k are both rotated by it, so the
attention logits grow by its square):

- ``linear``: every frequency divided by ``factor``.
- ``llama3``: Llama 3.1's wavelength bands (high kept, low divided, a blend between).
- ``yarn``: interpolation below and extrapolation above a ramp between the dimensions
  that turn ``beta_slow`` / ``beta_fast`` times within ``original_max_position_embeddings``,
  cos/sin times ``attention_factor`` (default ``0.1 ln(factor) + 1``, or the ratio of
  ``mscale`` / ``mscale_all_dim`` terms), the ramp's ends rounded unless ``truncate`` is
  false.
- ``longrope``: one divisor per frequency, ``short_factor`` or ``long_factor``, cos/sin
  times ``attention_factor`` (default ``sqrt(1 + ln(factor) / ln(original))``).
- ``dynamic``: NTK scaling of the base for a sequence of ``seq_len`` tokens.

Two types depend on the sequence length, where transformers recomputes the table for
every forward call (``dynamic_rope_update``): ``dynamic`` for ``seq_len`` past
``max_position_embeddings``, ``longrope`` short or long by whether ``seq_len`` passes
``original_max_position_embeddings`` (Phi-3 then drops its KV cache and prefills again).
On a paged cache whose keys are stored rotated, a table that changed with the length
would leave one sequence's keys rotated by several tables, and chunked prefill or a
prefix-cache hit would change the result. glowlm fixes both for the engine from the
context it serves (``--max-model-len``, ``context_len`` here), as vLLM does for LongRoPE:
``longrope`` takes the long factors when that context passes the original length, and
``dynamic`` is transformers' table for a sequence of that context. Both then equal
transformers whenever a prompt is as long as ``context_len`` (longrope: longer than the
original length; dynamic: exactly that length), or the context stays within the
original length (no scaling on either side).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from glowlm.errors import ModelLoadError

#: The ``rope_type`` values :func:`scaled_inv_freq` computes (``default``: none).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def rope_type(scaling: dict[str, Any] | None) -> str:
    """``rope_type`` (or the older ``type``) of a scaling dict; ``default`` when unset."""
    if not scaling:
        return "default"
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    return "longrope" if kind == "su" else str(kind)  # "su": Phi-3's first name for it


def _require(scaling: dict[str, Any], key: str, kind: str) -> Any:
    value = scaling.get(key)
    if value is None:
        raise ModelLoadError(f"rope scaling {kind!r} needs {key!r} in rope_scaling / "
                             "rope_parameters")
    return value


def original_positions(scaling: dict[str, Any], trained_positions: int) -> int:
    return int(scaling.get("original_max_position_embeddings") or trained_positions)


def _yarn(inv_freq: torch.Tensor, base: float, dim: int, scaling: dict[str, Any],
          trained_positions: int) -> tuple[torch.Tensor, float]:
    original = original_positions(scaling, trained_positions)
    factor = scaling.get("factor") or trained_positions / original
    factor = float(factor)
    attention = scaling.get("attention_factor")
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention is None:
        attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
                     if mscale and mscale_all else get_mscale(factor))
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:  # the dimension turning that often
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a one-point ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: the frequency kept, 0: divided by the factor
    return inv_freq / factor * ramp + inv_freq * extrapolate, float(attention)


def _longrope(inv_freq: torch.Tensor, dim: int, scaling: dict[str, Any],
              trained_positions: int, context_len: int) -> tuple[torch.Tensor, float]:
    original = original_positions(scaling, trained_positions)
    factor = scaling.get("factor") or trained_positions / original
    factor = float(factor)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor)
                                                        / math.log(original))
    key = "long_factor" if context_len > original else "short_factor"
    ext = torch.tensor(_require(scaling, key, "longrope"), dtype=torch.float64)
    if ext.numel() != dim // 2:
        raise ModelLoadError(f"rope scaling 'longrope': {key} has {ext.numel()} entries, "
                             f"the rotary dimension needs {dim // 2}")
    return inv_freq / ext, float(attention)


def _llama3(inv_freq: torch.Tensor, scaling: dict[str, Any], trained_positions: int
            ) -> torch.Tensor:
    factor = float(_require(scaling, "factor", "llama3"))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(original_positions(scaling, trained_positions))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def scaled_inv_freq(base: float, dim: int, scaling: dict[str, Any] | None,
                    trained_positions: int, context_len: int) -> tuple[torch.Tensor, float]:
    """``(inverse frequencies [dim // 2] in float64, attention factor)``.

    ``dim``: the rotary dimension; ``trained_positions``: the config's
    ``max_position_embeddings``; ``context_len``: the context the engine serves, which
    fixes the length-dependent types (module docstring).
    """
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    kind = rope_type(scaling)
    if kind == "dynamic":  # NTK: a larger base for a sequence of context_len tokens
        factor = float(_require(scaling, "factor", kind))  # type: ignore[arg-type]
        seq_len = max(context_len, trained_positions)
        base = base * ((factor * seq_len / trained_positions) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** exponent)
    if kind in ("default", "dynamic"):
        return inv_freq, 1.0
    assert scaling is not None
    if kind == "linear":
        return inv_freq / float(_require(scaling, "factor", kind)), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling, trained_positions), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, base, dim, scaling, trained_positions)
    if kind == "longrope":
        return _longrope(inv_freq, dim, scaling, trained_positions, context_len)
    raise ModelLoadError(f"rope scaling {kind!r} is not supported "
                         f"(supported: {', '.join(ROPE_TYPES)})")
