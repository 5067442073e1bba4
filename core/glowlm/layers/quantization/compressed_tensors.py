"""compressed-tensors checkpoints (``quant_method: compressed-tensors``, llm-compressor).

Two integer formats, chosen per config group (``config_groups.*.format`` or the
top-level ``format``):

- ``int-quantized``: int8 ``weight`` ``[N, K]`` with ``weight_scale`` ``[N, 1]``
  (channel) or one value (tensor). With 8-bit ``input_activations`` it is W8A8:
  ``dynamic`` per-token scales computed at run time, or a calibrated static
  per-tensor ``input_scale`` (and ``input_zero_point`` when asymmetric). Without
  them it is W8A16.
- ``pack-quantized`` (W4A16, W8A16): ``weight_packed`` int32 ``[N, K * bits / 32]``
  packed along the input dim, values stored with a ``2**(bits-1)`` offset;
  ``weight_scale`` ``[N, G]`` (``G = 1`` per channel); ``weight_zero_point`` int32
  packed along the output dim when asymmetric; ``weight_g_idx`` ``[K]`` for the
  group activation order; ``weight_shape`` (the unpacked ``[N, K]``).

A layer is quantized when a group's ``targets`` match it (``Linear``, a name, or
``re:<regex>``) and ``ignore`` does not; everything else (lm_head, embeddings) stays
in the model dtype.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from glowlm.errors import ModelLoadError
from glowlm.layers.quantization import QuantizationConfig
from glowlm.layers.quantization.kernels import Int8Weights, QuantKernels, WeightOnlyInt
from glowlm.layers.quantization.method import (
    QuantLinearMethod,
    W8A8Mixin,
    add_param,
    check_divisible,
    group_perm,
    unpack_int32,
)
from glowlm.ops.linear import LinearMethod

FORMATS = ("int-quantized", "pack-quantized")


@dataclass(frozen=True)
class Scheme:
    """One config group's weight and activation settings."""

    fmt: str
    bits: int
    strategy: str                  # channel, group or tensor
    group_size: int                # -1 unless strategy == group
    symmetric: bool
    actorder: str | None
    act_dynamic: bool | None       # None: no activation quantization
    act_symmetric: bool = True


def _parse_scheme(name: str, group: dict[str, Any], default_fmt: str | None) -> Scheme:
    fmt = str(group.get("format") or default_fmt or "")
    w = group.get("weights") or {}
    where = f"compressed-tensors group {name!r}"
    if fmt not in FORMATS:
        raise ModelLoadError(f"{where}: format {fmt!r} is not supported ({', '.join(FORMATS)})")
    if w.get("type", "int") != "int":
        raise ModelLoadError(f"{where}: {w.get('type')} weights are not supported (int only)")
    bits = int(w.get("num_bits", 8))
    strategy = str(w.get("strategy", "tensor"))
    if strategy not in ("channel", "group", "tensor"):
        raise ModelLoadError(f"{where}: weight strategy {strategy!r} is not supported")
    act = group.get("input_activations")
    act_dynamic = None
    act_sym = True
    if act:
        if act.get("type", "int") != "int" or int(act.get("num_bits", 8)) != 8:
            raise ModelLoadError(f"{where}: only int8 input activations are supported")
        if fmt != "int-quantized" or bits != 8 or not w.get("symmetric", True):
            raise ModelLoadError(f"{where}: activation quantization needs symmetric int8 "
                                 "int-quantized weights")
        dyn = act.get("dynamic")
        act_dynamic = bool(dyn)
        if act_dynamic and act.get("strategy", "token") != "token":
            raise ModelLoadError(f"{where}: dynamic activations must be per token")
        if not act_dynamic and act.get("strategy", "tensor") != "tensor":
            raise ModelLoadError(f"{where}: static activations must be per tensor")
        act_sym = bool(act.get("symmetric", True))
    if fmt == "pack-quantized" and bits not in (4, 8):
        raise ModelLoadError(f"{where}: pack-quantized {bits}-bit weights are not supported "
                             "(4 or 8)")
    if fmt == "int-quantized" and (bits != 8 or not w.get("symmetric", True)):
        raise ModelLoadError(f"{where}: int-quantized weights must be symmetric int8")
    if strategy == "tensor" and fmt == "pack-quantized":
        raise ModelLoadError(f"{where}: per-tensor pack-quantized weights are not supported")
    group_size = int(w.get("group_size") or -1) if strategy == "group" else -1
    return Scheme(fmt, bits, strategy, group_size, bool(w.get("symmetric", True)),
                  w.get("actorder"), act_dynamic, act_sym)


def _matches(target: str, prefix: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], prefix) is not None
    return prefix == target or prefix.endswith("." + target)


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    def __init__(self, groups: list[tuple[list[str], Scheme]], ignore: Sequence[str]) -> None:
        super().__init__()
        self.groups, self.ignore = groups, list(ignore)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        status = config.get("quantization_status", "compressed")
        if status not in ("compressed", "frozen"):
            raise ModelLoadError(f"compressed-tensors quantization_status {status!r}: only "
                                 "compressed checkpoints load")
        if config.get("sparsity_config") or config.get("transform_config"):
            raise ModelLoadError("compressed-tensors sparsity and transforms are not supported")
        groups = [(list(g.get("targets") or []), _parse_scheme(name, g, config.get("format")))
                  for name, g in (config.get("config_groups") or {}).items()]
        if not groups:
            raise ModelLoadError("compressed-tensors quantization_config has no config_groups")
        return cls(groups, config.get("ignore") or [])

    def scheme_for(self, prefix: str) -> Scheme | None:
        """The scheme of the layer at ``prefix`` (None: unquantized).

        ``Linear`` targets every linear layer; a fused layer (``qkv_proj``) is
        matched by its first projection's name (the tools quantize q, k and v alike).
        The LM head and embeddings never ask: they are not linear layers here.
        """
        names = [prefix]
        for fused, part in (("qkv_proj", "q_proj"), ("gate_up_proj", "gate_proj")):
            if prefix.endswith(fused):
                names = [prefix[: -len(fused)] + part]
        if any(_matches(i, n) for i in self.ignore for n in names):
            return None
        for targets, scheme in self.groups:
            if any(t == "Linear" or _matches(t, n) for t in targets for n in names):
                return scheme
        return None

    def linear_method(self, prefix: str) -> LinearMethod | None:
        scheme = self.scheme_for(prefix)
        if scheme is None:
            return None
        if scheme.act_dynamic is not None:
            return CTW8A8LinearMethod(scheme, self.kernels())
        if scheme.fmt == "int-quantized":
            return CTW8A16IntLinearMethod(scheme, self.kernels())
        return CTPackedLinearMethod(scheme, self.kernels())


class _CTMethod(QuantLinearMethod):
    def __init__(self, scheme: Scheme, kernels: QuantKernels) -> None:
        super().__init__(kernels)
        self.scheme = scheme

    def _scale_param(self, layer: nn.Module, n: int, shards: int, groups: int,
                     dtype: torch.dtype) -> None:
        if self.scheme.strategy == "tensor":
            add_param(layer, "weight_scale", (shards,), torch.float32, shard_scalar=True)
        else:
            add_param(layer, "weight_scale", (n, groups), dtype, output_dim=0)

    def _row_scales(self, layer: nn.Module) -> torch.Tensor:
        """float32 [N, G]; a per-tensor scale repeated over its projection's rows."""
        s = layer.weight_scale.data.float()
        if self.scheme.strategy != "tensor":
            return s
        sizes = torch.tensor(layer.output_sizes)
        return s.repeat_interleave(sizes).unsqueeze(1)


class CTPackedLinearMethod(_CTMethod):
    """pack-quantized W4A16 / W8A16 (group or channel scales, optional zero points)."""

    param_names = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx",
                   "weight_shape")

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        s = self.scheme
        pack = 32 // s.bits
        n = sum(output_partition_sizes)
        prefix = getattr(layer, "prefix", "?")
        group = input_size if s.group_size == -1 else s.group_size
        check_divisible(input_size, group, "input size", prefix)
        check_divisible(input_size, pack, "input size", prefix)
        layer.quant_group = group
        add_param(layer, "weight_packed", (n, input_size // pack), torch.int32, output_dim=0,
                  input_dim=1, packed_dim=1, packed_factor=pack)
        self._scale_param(layer, n, len(output_partition_sizes), input_size // group,
                          params_dtype)
        if not s.symmetric:
            for size in output_partition_sizes:
                check_divisible(size, pack, "output size", prefix)
            add_param(layer, "weight_zero_point", (n // pack, input_size // group), torch.int32,
                      output_dim=0, packed_dim=0, packed_factor=pack)
        if s.actorder == "group":
            add_param(layer, "weight_g_idx", (input_size,), torch.int32, input_dim=0)
        add_param(layer, "weight_shape", (2,), torch.int64)

    def canonical(self, layer: nn.Module) -> WeightOnlyInt:
        s = self.scheme
        q = unpack_int32(layer.weight_packed.data, s.bits, dim=1)
        shape = tuple(int(v) for v in layer.weight_shape.data)
        if len(layer.output_sizes) == 1 and shape != tuple(q.shape):
            raise ModelLoadError(f"{layer.prefix}: weight_shape {shape} does not match the "
                                 f"layer's {tuple(q.shape)}")
        scales = self._row_scales(layer)
        if s.symmetric:
            zeros = torch.full_like(scales, float(1 << (s.bits - 1)))
        else:
            zeros = unpack_int32(layer.weight_zero_point.data, s.bits, dim=0).float()
        perm = None
        if s.actorder == "group":
            perm = group_perm(layer.weight_g_idx.data, layer.quant_group, layer.prefix)
            if perm is not None:
                q = q.index_select(1, perm)
        return WeightOnlyInt(q.to(torch.uint8).contiguous(), scales.contiguous(),
                             zeros.contiguous(), s.bits, layer.quant_group, perm)


class CTW8A16IntLinearMethod(_CTMethod):
    """int-quantized int8 weights without activation quantization (W8A16)."""

    param_names = ("weight", "weight_scale")

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        n = sum(output_partition_sizes)
        layer.quant_group = input_size
        add_param(layer, "weight", (n, input_size), torch.int8, output_dim=0, input_dim=1)
        self._scale_param(layer, n, len(output_partition_sizes), 1, params_dtype)

    def canonical(self, layer: nn.Module) -> WeightOnlyInt:
        q = (layer.weight.data.to(torch.int16) + 128).to(torch.uint8)
        scales = self._row_scales(layer)
        return WeightOnlyInt(q.contiguous(), scales.contiguous(),
                             torch.full_like(scales, 128.0), 8, layer.quant_group)


class CTW8A8LinearMethod(W8A8Mixin, _CTMethod):
    """int-quantized W8A8: int8 x int8 with int32 sums, dynamic or static activations."""

    param_names = ("weight", "weight_scale", "input_scale", "input_zero_point")

    def create_weights(self, layer: nn.Module, input_size: int,
                       output_partition_sizes: Sequence[int], params_dtype: torch.dtype
                       ) -> None:
        n = sum(output_partition_sizes)
        shards = len(output_partition_sizes)
        add_param(layer, "weight", (n, input_size), torch.int8, output_dim=0, input_dim=1)
        self._scale_param(layer, n, shards, 1, torch.float32)
        if not self.scheme.act_dynamic:
            add_param(layer, "input_scale", (shards,), torch.float32, shard_scalar=True)
            if not self.scheme.act_symmetric:
                add_param(layer, "input_zero_point", (shards,), torch.int32, shard_scalar=True)

    def canonical(self, layer: nn.Module) -> Int8Weights:
        scale = self._row_scales(layer)[:, 0].contiguous()
        if self.scheme.act_dynamic:
            return Int8Weights(layer.weight.data.contiguous(), scale)
        in_scales = layer.input_scale.data.float()
        if not self.scheme.act_symmetric:
            zps = layer.input_zero_point.data
            if not bool((zps == zps[0]).all() and (in_scales == in_scales[0]).all()):
                raise ModelLoadError(f"{layer.prefix}: fused projections with different "
                                     "asymmetric input scales are not supported")
            return Int8Weights(layer.weight.data.contiguous(), scale, float(in_scales[0]),
                               int(zps[0]))
        # q, k and v (gate and up) see the same input; their calibrated scales agree,
        # and the largest keeps every projection's range (vLLM's rule).
        return Int8Weights(layer.weight.data.contiguous(), scale, float(in_scales.max()))
