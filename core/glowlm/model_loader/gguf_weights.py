"""A GGUF file's weights as the loader receives them, one tensor at a time.

Each tensor is renamed to its Hugging Face name (:func:`~glowlm.model_loader.gguf.hf_name`),
the two layout changes llama.cpp's converter makes are undone (Llama's q/k rows are
permuted for its rotary layout; Gemma's norm weights have the +1 baked in), and it is
dequantized to the run dtype when the loader asks for it, so peak memory stays the model
plus one tensor. A weight of a layer that runs natively
(:func:`~glowlm.model_loader.gguf.native_quant_config`) is handed over as its blocks
instead (:mod:`glowlm.layers.quantization.gguf`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glowlm.errors import ModelLoadError
from glowlm.model_loader.gguf import GEMMA_NORMS, _reader, field, hf_name


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (rotary pairs interleaved -> halves)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


#: The 32-weight block types dequantized in torch; the rest through the gguf package.
TORCH_TYPES = ("Q8_0", "Q4_0", "Q4_1")


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """One GGUF tensor as float32 of ``shape`` (rows, columns)."""
    if type_name in ("F32", "F16"):
        return torch.from_numpy(np.array(data, copy=True)).reshape(shape).float()
    if type_name == "BF16":
        raw = torch.from_numpy(np.array(data, copy=True).view(np.int16))
        return raw.view(torch.bfloat16).reshape(shape).float()
    if type_name in TORCH_TYPES:
        # The blocks as the native path reads them (w = scale·q + offset, or
        # scale·(q − zero) for an integer zero): the products ggml forms, so the values
        # equal the gguf package's bitwise (tested).
        from glowlm.layers.quantization.gguf import groups

        q, scale, zero, offset = groups(data, type_name)
        if zero is not None:
            w = (q.float() - zero) * scale.unsqueeze(1)
        else:
            assert offset is not None
            w = q.float() * scale.unsqueeze(1) + offset.unsqueeze(1)
        return w.reshape(shape)
    import gguf
    from gguf.quants import dequantize as np_dequantize

    out = np_dequantize(np.asarray(data), gguf.GGMLQuantizationType[type_name])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)


def _rows(arch: str, name: str, n_head: int, n_kv: int, w: torch.Tensor) -> torch.Tensor:
    """Undo the converter's per-row changes (Llama q/k permutation) on any row-major part."""
    if arch == "llama" and n_head and ".q_proj." in name:
        return _unpermute(w, n_head)
    if arch == "llama" and n_head and ".k_proj." in name:
        return _unpermute(w, n_kv)
    return w


def iterate_tensors(path: str | Path, hf_config: Any, dtype: torch.dtype,
                    native: Mapping[str, tuple[int, int]] | None = None
                    ) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """Yield ``(hf_name, load)`` for every tensor the model reads; ``load()`` dequantizes
    that one tensor to ``dtype`` (floats) when called.

    A weight whose module is in ``native`` (HF module name -> the (bits, group) its
    layer runs in, from :func:`native_quant_config`) is yielded as its blocks instead:
    ``<module>.gguf_q``, ``.gguf_scales`` and ``.gguf_zeros``
    (:mod:`glowlm.layers.quantization.gguf`). With
    ``lm_head`` native and the embeddings tied, ``token_embd`` is the LM head's blocks
    (the embedding looks its rows up there; no dense copy is read).
    """
    path = Path(path)
    native = native or {}
    reader = _reader(path)
    arch = field(reader, "general.architecture")
    n_head = int(getattr(hf_config, "num_attention_heads", 0) or 0)
    n_kv = int(getattr(hf_config, "num_key_value_heads", 0) or n_head)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    for t in reader.tensors:
        name = hf_name(arch, t.name)
        if name is None:
            continue
        # GGUF lists dimensions fastest-first; torch wants (rows, columns).
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        if name.endswith(".shared_expert_gate.weight") and len(shape) == 1:
            shape = (1, *shape)  # llama.cpp writes Qwen2-MoE's [1, hidden] gate as a vector
        module = name.removesuffix(".weight") if name.endswith(".weight") else None
        if module == "model.embed_tokens" and tied and "lm_head" in native:
            module = "lm_head"
        elif module == "lm_head" and tied:
            module = None  # the tied model reads no output.weight
        if module is not None and module in native:
            yield from _native_parts(path, t, module, shape, native[module],
                                     lambda n, w: _rows(arch, n, n_head, n_kv, w))
            continue

        def load(t: Any = t, name: str = name, shape: tuple[int, ...] = shape) -> torch.Tensor:
            try:
                w = dequantize(t.data, t.tensor_type.name, shape)
            except (ValueError, RuntimeError) as exc:
                raise ModelLoadError(f"{path}: cannot read tensor {t.name} "
                                     f"({t.tensor_type.name}, {shape}): {exc}") from None
            w = _rows(arch, name, n_head, n_kv, w)
            if arch in GEMMA_NORMS and name.endswith("norm.weight"):
                w = w - 1.0  # the converter stores Gemma's (1 + w); the model applies 1 + w
            return w.to(dtype)

        yield name, load


def _native_parts(path: Path, t: Any, layer: str, shape: tuple[int, ...],
                  fmt: tuple[int, int],
                  rows: Callable[[str, torch.Tensor], torch.Tensor]
                  ) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """The three block tensors of one natively run weight, split once on first use."""
    from glowlm.layers.quantization.gguf import split_blocks

    parts: dict[str, torch.Tensor] = {}

    def get(key: str) -> torch.Tensor:
        if not parts:
            # Stacked experts ``[experts, out, in]`` are split as one matrix of all the
            # experts' rows (blocks never cross a row), then stacked again.
            flat = (shape[0] * shape[1], shape[2]) if len(shape) == 3 else shape
            try:
                q, scales, zeros = split_blocks(t.data, t.tensor_type.name, flat, fmt[1],
                                               fmt[0])
            except (ValueError, RuntimeError) as exc:
                raise ModelLoadError(f"{path}: cannot read tensor {t.name} "
                                     f"({t.tensor_type.name}, {shape}): {exc}") from None
            name = f"{layer}.weight"
            if len(shape) == 3:
                q, scales, zeros = (x.view(shape[0], shape[1], -1) for x in (q, scales, zeros))
            parts.update(gguf_q=rows(name, q), gguf_scales=rows(name, scales),
                         gguf_zeros=rows(name, zeros))
        return parts.pop(key)

    for key in ("gguf_q", "gguf_scales", "gguf_zeros"):
        yield f"{layer}.{key}", (lambda key=key: get(key))
