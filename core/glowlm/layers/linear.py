"""Linear layers ready for tensor parallelism.

A linear layer owns its *shape* (which shard of the full weight this rank
holds); its :class:`~glowlm.ops.linear.LinearMethod` owns the *representation*
(dense, int4 with scales, a prepacked blocked layout) and the matmul. Weight loading goes through
``param.weight_loader(param, loaded_tensor, shard_id)``, which takes the full
checkpoint tensor and keeps this rank's slice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from glowlm.distributed.parallel import divide
from glowlm.errors import ModelLoadError
from glowlm.layers.context import ModelParts
from glowlm.layers.weights import copy_checked
from glowlm.lora.slots import LoRASlots


def _adapts(prefix: str) -> bool:
    """Layers an adapter may target: the projections of the decoder layers (not a head)."""
    leaf = prefix.rsplit(".", 1)[-1]
    return leaf not in ("lm_head", "score", "classifier") and "." in prefix


def _pack_factor(param: torch.Tensor, dim: int) -> int:
    """Values per element along ``dim`` (8 for int32 words of 4-bit weights, else 1)."""
    return getattr(param, "packed_factor", 1) if getattr(param, "packed_dim", None) == dim else 1


def _copy_shard_scalar(param: torch.Tensor, loaded: torch.Tensor, index: int, name: str
                       ) -> None:
    """A per-tensor value (quantization scale) of projection ``index`` of a fused layer."""
    if loaded.numel() != 1:
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(loaded.shape)} but the model "
                             "expects one value")
    param.data[index] = loaded.reshape(())


class LinearBase(nn.Module):
    """Common parts: the method, the bias, the per-rank sizes."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool,
                 parts: ModelParts, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.parallel = parts.parallel
        self.method = parts.linear_method(prefix)
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        #: The model dtype: what activations arrive in (a quantized layer's weights do not
        #: say, and its linear-choice candidates need it).
        self.params_dtype = parts.dtype
        self.method.create_weights(self, input_size, self.output_sizes, parts.dtype)
        if bias:
            b = nn.Parameter(torch.empty(sum(self.output_sizes), dtype=parts.dtype),
                             requires_grad=False)
            b.output_dim = 0  # type: ignore[attr-defined]
            self.register_parameter("bias", b)
        else:
            self.bias = None
        for p in self.parameters(recurse=False):
            p.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        #: Adapter slots (--enable-lora), for every projection of the decoder layers.
        self.lora: LoRASlots | None = None
        if parts.lora is not None and _adapts(prefix):
            self.lora = LoRASlots(self, parts.lora)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The method's matmul, plus the step's adapter updates on their rows."""
        y = self.method.apply(self, x, bias)
        lora = self.lora
        if lora is not None and lora.state.active:
            y = lora.state.update(lora, x, y)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    @property
    def full_input_size(self) -> int:
        """The input features of the whole (unsharded) projection."""
        return self.input_size

    def lora_shard(self, index: int, a: torch.Tensor, b: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's part of an adapter's (A, B) for projection ``index``."""
        return a, b

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: str | int | None = None) -> None:
        if getattr(param, "shard_scalar", False):
            return _copy_shard_scalar(param, loaded, 0, self.prefix)
        copy_checked(param, loaded, self.prefix)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool, parts: ModelParts,
                 prefix: str) -> None:
        super().__init__(input_size, [output_size], bias, parts, prefix)


class ColumnParallelLinear(LinearBase):
    """Output features split across TP ranks; each rank keeps rows ``[r*n/tp, (r+1)*n/tp)``."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool,
                 parts: ModelParts, prefix: str, gather_output: bool = False) -> None:
        tp = parts.parallel.tp_size
        self.full_output_sizes = list(output_sizes)
        self.gather_output = gather_output
        super().__init__(input_size, [divide(s, tp, prefix) for s in output_sizes], bias,
                         parts, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.bias)
        return self.parallel.all_gather_last_dim(y) if self.gather_output else y

    def _shard(self, loaded: torch.Tensor, dim: int, index: int, pack: int = 1
               ) -> torch.Tensor:
        size = self.output_sizes[index] // pack
        return loaded.narrow(dim, self.parallel.tp_rank * size, size)

    def lora_shard(self, index: int, a: torch.Tensor, b: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """All of A; this rank's output rows of B (as of the weight)."""
        return a, (self._shard(b, 0, index) if self.parallel.tp_size > 1 else b)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: str | int | None = None) -> None:
        dim = getattr(param, "output_dim", None)
        index = self.shard_index(shard_id)
        if getattr(param, "shard_scalar", False):
            return _copy_shard_scalar(param, loaded, index, f"{self.prefix}[{shard_id}]")
        if dim is None:
            return copy_checked(param, loaded, self.prefix)
        pack = _pack_factor(param, dim)  # packed quantized tensors: offsets in words
        offset = sum(self.output_sizes[:index]) // pack
        if shard_id is None and len(self.output_sizes) > 1:  # fused tensor in the checkpoint
            if self.parallel.tp_size == 1:
                return copy_checked(param.data, loaded, self.prefix)
            # Split it into its projections (GPT-2's c_attn is q|k|v) and shard each.
            sizes = self.checkpoint_sizes()
            if loaded.dim() <= dim or loaded.shape[dim] != sum(sizes):
                raise ModelLoadError(
                    f"tensor {self.prefix!r} has shape {tuple(loaded.shape)}; expected "
                    f"{sum(sizes)} rows along dim {dim} ({' + '.join(map(str, sizes))})")
            for sid, piece in zip(self.shard_ids(), loaded.split(sizes, dim), strict=True):
                self.weight_loader(param, piece, sid)
            return None
        target = param.data.narrow(dim, offset, self.output_sizes[index] // pack)
        copy_checked(target, self._shard(loaded, dim, index, pack),
                      f"{self.prefix}[{shard_id}]")

    def shard_index(self, shard_id: str | int | None) -> int:
        return 0 if shard_id is None else int(shard_id)

    def checkpoint_sizes(self) -> list[int]:
        """Full (unsharded) size of each fused projection as the checkpoint stores it."""
        return list(self.full_output_sizes)

    def shard_ids(self) -> list[str | int]:
        return list(range(len(self.full_output_sizes)))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several projections of the same input fused in one GEMM (gate and up)."""


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q, k, v projection; heads split across ranks (KV heads replicated if fewer)."""

    def __init__(self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int,
                 bias: bool, parts: ModelParts, prefix: str) -> None:
        tp = parts.parallel.tp_size
        if num_kv_heads % tp and tp % num_kv_heads:
            from glowlm.errors import ConfigError

            raise ConfigError(f"{prefix}: {num_kv_heads} KV heads cannot be split over or "
                              f"replicated across {tp} tensor-parallel ranks (one must divide "
                              "the other)")
        # Fewer KV heads than ranks: each rank keeps one KV head, shared by
        # ``kv_replicas`` consecutive ranks (their query heads are that head's group).
        self.kv_replicas = max(1, tp // num_kv_heads)
        self._checkpoint = [num_heads * head_size, num_kv_heads * head_size,
                            num_kv_heads * head_size]
        kv_total = max(num_kv_heads, tp) * head_size
        super().__init__(hidden_size, [num_heads * head_size, kv_total, kv_total], bias, parts,
                         prefix)

    def shard_index(self, shard_id: str | int | None) -> int:
        return {"q": 0, "k": 1, "v": 2, None: 0}[shard_id]

    def checkpoint_sizes(self) -> list[int]:
        return list(self._checkpoint)

    def shard_ids(self) -> list[str | int]:
        return ["q", "k", "v"]

    def _shard(self, loaded: torch.Tensor, dim: int, index: int, pack: int = 1
               ) -> torch.Tensor:
        size = self.output_sizes[index] // pack
        rank = self.parallel.tp_rank if index == 0 else self.parallel.tp_rank // self.kv_replicas
        return loaded.narrow(dim, rank * size, size)


class RowParallelLinear(LinearBase):
    """Input features split across TP ranks; partial outputs summed by all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool, parts: ModelParts,
                 prefix: str) -> None:
        super().__init__(divide(input_size, parts.parallel.tp_size, prefix), [output_size],
                         bias, parts, prefix)

    @property
    def full_input_size(self) -> int:
        return self.input_size * self.parallel.tp_size

    def lora_shard(self, index: int, a: torch.Tensor, b: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's input columns of A; all of B (the update is a partial sum the
        layer's all-reduce completes)."""
        if self.parallel.tp_size == 1:
            return a, b
        return a.narrow(1, self.parallel.tp_rank * self.input_size, self.input_size), b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return self.matmul(x, self.bias)
        # The bias is added once, after the reduction, not on every rank; an adapter's
        # update on a shard of the input is a partial sum the reduction completes.
        y = self.matmul(x, None)
        y = self.parallel.all_reduce(y)
        return y + self.bias if self.bias is not None else y

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: str | int | None = None) -> None:
        if getattr(param, "shard_scalar", False):
            return _copy_shard_scalar(param, loaded, 0, self.prefix)
        dim = getattr(param, "input_dim", None)
        if dim is not None and self.parallel.tp_size > 1:
            size = param.shape[dim]
            loaded = loaded.narrow(dim, self.parallel.tp_rank * size, size)
        copy_checked(param, loaded, self.prefix)
