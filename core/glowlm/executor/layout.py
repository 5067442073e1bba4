"""Refusing a tensor/pipeline layout the model cannot take, before any rank starts.

It reads the checkpoint's shape (:func:`glowlm.engine.memory.model_dims`), so it sits
with the ranks rather than with the parallel state the layers read
(:mod:`glowlm.distributed.parallel`), which must not depend on the loader.
"""

from __future__ import annotations

from typing import Any


def check_layout(config: Any) -> None:
    """Refuse a TP/PP layout the model cannot take before any rank process starts:
    heads (and the MLP width) must split over TP, KV heads split or replicate, and
    there must be a layer per pipeline stage."""
    from glowlm.engine.memory import model_dims
    from glowlm.errors import ConfigError
    from glowlm.model_loader.loader import read_model_dir

    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    info = read_model_dir(config.model, getattr(config, "revision", None),
                          getattr(config, "gguf_file", None),
                          hf_overrides=getattr(config, "hf_overrides", None))
    d = model_dims(info.hf_config)
    if d.heads % tp:
        raise ConfigError(f"--tensor-parallel-size {tp} does not divide the model's "
                          f"{d.heads} attention heads")
    if d.kv_heads % tp and tp % d.kv_heads:
        raise ConfigError(f"--tensor-parallel-size {tp} neither divides nor is a multiple of "
                          f"the model's {d.kv_heads} KV heads")
    if d.intermediate % tp:
        raise ConfigError(f"--tensor-parallel-size {tp} does not divide the MLP width "
                          f"({d.intermediate})")
    if pp > d.layers:
        raise ConfigError(f"--pipeline-parallel-size {pp} exceeds the model's {d.layers} "
                          "layers")
