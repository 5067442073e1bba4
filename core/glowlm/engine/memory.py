"""Memory planning before loading: weights + KV cache + activations vs what a rank has.

Why before loading: the reference system loads for minutes, then the kernel's OOM
killer ends it with exit code 9 and no explanation. Everything here is computed
from the config and the checkpoint's safetensors headers (a few KB read), so an
impossible setting fails in a second with the numbers and what to change.

What a rank "has" is the smallest of: MemAvailable, the cgroup memory limit minus
what the cgroup already uses, and (when the rank's memory is bound to a NUMA node)
that node's free and reclaimable memory. ``GLOWLM_CPU_KVCACHE_SPACE=auto`` takes
:data:`AUTO_KV_SHARE` of what is left after weights, activations and headroom,
capped at what ``max_num_seqs`` sequences of ``max_model_len`` tokens could use.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glowlm.attention.backend import kv_bytes_per_token as attention_kv_bytes
from glowlm.attention.backend import resolve_kv_cache_dtype
from glowlm.errors import MemoryPlanError

GIB = 1 << 30
AUTO_KV_SHARE = 0.5
#: Left free for the kernel, the tokenizer and allocator slack.
HEADROOM_BYTES = 512 << 20
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                      "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "U16": 2,
                      "U32": 4, "U64": 8}


def fmt_bytes(n: int) -> str:
    """GiB with two decimals, or MiB below 0.1 GiB (tiny models would read 0.00 GiB)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class ModelDims:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


def model_dims(hf_config: Any) -> ModelDims:
    """The sizes memory depends on, under every naming the supported models use."""
    def first(*names: str, default: int = 0) -> int:
        for n in names:
            v = getattr(hf_config, n, None)
            if isinstance(v, int) and v > 0:
                return v
        return default

    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head", default=1)
    return ModelDims(
        layers=first("num_hidden_layers", "n_layer"), hidden=hidden, heads=heads,
        kv_heads=first("num_key_value_heads", default=heads),
        head_dim=first("head_dim", default=hidden // heads),
        intermediate=first("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden),
        vocab=first("vocab_size"))


def _safetensors_bytes(path: Path, elem: int) -> tuple[int, int]:
    """(total bytes once loaded, largest tensor) from the header: floats cast to ``elem``."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    total = largest = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        numel = 1
        for d in meta["shape"]:
            numel *= d
        dt = meta["dtype"]
        nbytes = numel * (elem if dt.startswith(("F", "BF")) else _SAFETENSORS_BYTES.get(dt, 4))
        total += nbytes
        largest = max(largest, nbytes)
    return total, largest


def weight_bytes(info: Any, dtype: torch.dtype) -> tuple[int, int, str]:
    """(bytes the loaded weights take, largest single tensor, how it was estimated).

    Mirrors the loader: floating tensors are cast to ``dtype``, integer (quantized)
    tensors keep their size. Pickle checkpoints are scaled from their file size.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    if getattr(info, "gguf_file", None) is not None:
        from glowlm.model_loader import gguf

        native = getattr(info, "gguf_native", None) or {}
        total, largest = gguf.weight_bytes(info.gguf_file, elem, native)
        how = "native blocks at their width, the rest dequantized" if native else "dequantized"
        return total, largest, f"GGUF header, {how}"
    path = Path(info.path)
    files = sorted(path.glob("*.safetensors"))
    if files:
        sizes = [_safetensors_bytes(f, elem) for f in files]
        return sum(s[0] for s in sizes), max(s[1] for s in sizes), "safetensors headers"
    pickles = sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))
    own = torch.empty((), dtype=info.dtype).element_size()
    if pickles:
        total = sum(p.stat().st_size for p in pickles) * elem // own
        return total, total // max(1, 4 * model_dims(info.hf_config).layers), "file sizes"
    d = model_dims(info.hf_config)
    per_layer = (d.hidden * (d.heads + 2 * d.kv_heads) * d.head_dim
                 + d.heads * d.head_dim * d.hidden + 3 * d.hidden * d.intermediate)
    params = d.layers * per_layer + 2 * d.vocab * d.hidden
    return params * elem, d.vocab * d.hidden * elem, "parameter count from config.json"


def kv_bytes_per_token(dims: ModelDims, dtype: torch.dtype, tp: int = 1) -> int:
    """K and V of one token across this rank's layers (kv heads are split over TP)."""
    return attention_kv_bytes(dims.layers, max(1, dims.kv_heads // tp), dims.head_dim, dtype)


def activation_bytes(dims: ModelDims, dtype: torch.dtype, config: Any, max_model_len: int,
                     kv_bytes: int) -> int:
    """Peak of one step: a full token budget's hidden states, gathered K/V, logits.

    Hidden: residual, norm, attention output, QKV and the MLP's gate/up/act for
    ``max_num_batched_tokens`` tokens. Gathered K/V: the reference attention copies
    one layer's K/V of the running sequences twice. Logits and sampling
    probabilities in float32 for ``max_num_seqs`` rows.
    """
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = min(config.max_num_batched_tokens, config.max_num_seqs * max_model_len)
    hidden = tokens * (4 * dims.hidden + 2 * (dims.heads + 2 * dims.kv_heads) * dims.head_dim
                       + 3 * dims.intermediate) * elem
    gathered = 2 * kv_bytes // max(1, dims.layers)
    logits = 3 * config.max_num_seqs * dims.vocab * 4
    return hidden + gathered + logits


def _meminfo_available(meminfo: str) -> int | None:
    m = re.search(r"MemAvailable:\s+(\d+)\s*kB", meminfo)
    return int(m.group(1)) * 1024 if m else None


def available_memory(topo: Any, node: int | None, meminfo: str | None = None
                     ) -> tuple[int, str]:
    """(bytes, where the limit comes from): the tightest of MemAvailable, cgroup, node."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            meminfo = ""
    limits: list[tuple[int, str]] = []
    avail = _meminfo_available(meminfo)
    if avail is not None:
        limits.append((avail, "MemAvailable"))
    cg = topo.cgroup
    if cg.memory_limit_bytes is not None:
        limits.append((max(0, cg.memory_limit_bytes - (cg.memory_used_bytes or 0)),
                       f"cgroup memory limit ({cg.memory_limit_bytes / GIB:.1f} GiB)"))
    if node is not None:
        n = topo.node(node)
        if n.total_bytes:
            limits.append((n.available_bytes, f"NUMA node {node} free memory"))
    if not limits:
        return 1 << 62, "no memory information (not checked)"
    return min(limits)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-rank bytes; ``kv_cache_bytes`` is what the engine allocates for the KV cache."""

    kv_cache_bytes: int
    weights_bytes: int = 0
    activation_bytes: int = 0
    headroom_bytes: int = HEADROOM_BYTES
    available_bytes: int = 0
    available_source: str = ""
    kv_bytes_per_token: int = 0
    kv_auto: bool = False
    max_model_len_that_fits: int = 0
    weights_source: str = ""
    kv_dtype: str = ""  #: the cache's storage dtype (--kv-cache-dtype)
    #: --enable-lora: the adapter slots of every layer (--max-loras x --max-lora-rank).
    lora_bytes: int = 0
    lora_slots: str = ""
    #: speculative draft_model: the draft's weights and its KV cache (a share of the KV
    #: space in proportion to its bytes per token, so it holds the target's tokens).
    draft_weights_bytes: int = 0
    draft_kv_bytes: int = 0

    @property
    def needed_bytes(self) -> int:
        return (self.weights_bytes + self.kv_cache_bytes + self.activation_bytes
                + self.headroom_bytes + self.lora_bytes + self.draft_bytes)

    @property
    def draft_bytes(self) -> int:
        return self.draft_weights_bytes + self.draft_kv_bytes

    def describe(self) -> str:
        """One line for the start-up log."""
        kv = "auto" if self.kv_auto else "GLOWLM_CPU_KVCACHE_SPACE"
        tokens = self.kv_cache_bytes // max(1, self.kv_bytes_per_token)
        stored = f", {self.kv_dtype}" if self.kv_dtype else ""
        lora = (f" + LoRA slots {fmt_bytes(self.lora_bytes)} ({self.lora_slots})"
                if self.lora_bytes else "")
        draft = (f" + draft model {fmt_bytes(self.draft_weights_bytes)} weights, KV cache "
                 f"{fmt_bytes(self.draft_kv_bytes)}" if self.draft_bytes else "")
        return (f"memory per rank: weights {fmt_bytes(self.weights_bytes)}{lora} + KV cache "
                f"{fmt_bytes(self.kv_cache_bytes)} ({kv}: {tokens} tokens{stored}){draft} + "
                f"activations "
                f"{fmt_bytes(self.activation_bytes)} + headroom "
                f"{fmt_bytes(self.headroom_bytes)} = {fmt_bytes(self.needed_bytes)} of "
                f"{fmt_bytes(self.available_bytes)} ({self.available_source})")


def rank_node(world_size: int = 1, serving: bool = False, rank: int = 0
              ) -> tuple[Any, int | None]:
    """The live topology and the NUMA node ``rank``'s memory will be bound to, if any."""
    topo, node, _ = rank_placement(world_size, serving, rank)
    return topo, node


def rank_placement(world_size: int = 1, serving: bool = False, rank: int = 0
                   ) -> tuple[Any, int | None, int]:
    """(live topology, ``rank``'s memory node or None, ranks sharing that memory).

    Ranks bound to the same node share its free memory; unbound ranks (one node,
    or ``nobind``) share the whole machine's.
    """
    from glowlm import envs
    from glowlm.runtime import binding, topology

    topo = topology.read()
    applied = binding.applied_plan()
    if applied is None or (len(applied.ranks), applied.rank) != (world_size, rank):
        env = envs.get()
        applied = binding.plan(topo, env.omp_threads_bind, env.num_reserved_cpus,
                               num_ranks=world_size, rank=rank, serving=serving)
    node = applied.this.node
    return topo, node, sum(1 for r in applied.ranks if r.node == node)


def plan_ranks(info: Any, dtype: torch.dtype, config: Any, max_model_len: int, topo: Any,
               bind: str = "auto", reserved: int | None = None,
               meminfo: str | None = None) -> list[MemoryPlan]:
    """Every rank's placement and memory plan on ``topo`` (a recorded machine in tests):
    the binding each rank would get, then its plan against its node. Raises the first
    rank's MemoryPlanError (naming rank and node) or the binding's ConfigError."""
    from glowlm.runtime import binding

    world = config.world_size
    placement = binding.plan(topo, bind, reserved, num_ranks=world, serving=config.online)
    plans = []
    for r in placement.ranks:
        sharing = sum(1 for o in placement.ranks if o.node == r.node)
        plans.append(plan_memory(info, dtype, config, max_model_len, rank=r.rank, topo=topo,
                                 node=r.node, meminfo=meminfo, sharing=sharing))
    return plans


def rank_weight_bytes(total: int, dims: ModelDims, dtype: torch.dtype, tp: int, pp: int,
                      tied: bool) -> int:
    """One rank's share: layers split over TP x PP; the token embedding and LM head are
    split over TP only (every pipeline stage keeps them: stage 0 embeds and computes
    logits)."""
    elem = torch.empty((), dtype=dtype).element_size()
    vocab = min(total, dims.vocab * dims.hidden * elem * (1 if tied else 2))
    return (total - vocab) // (tp * pp) + vocab // tp


def _fits_message(plan: MemoryPlan, config: Any, dtype: torch.dtype, world: int,
                  model_limit: int, quantized: bool, rank: int = 0, node: int | None = None
                  ) -> str:
    # Quantized checkpoints are not offered; halving fp32 weights and, on a machine
    # with more NUMA nodes than ranks, more ranks are.
    smaller = ("--dtype bfloat16 (half the weight bytes) or a smaller model"
               if dtype == torch.float32 and not quantized else "a smaller model")
    spare = plan.available_bytes - plan.weights_bytes - plan.lora_bytes - plan.activation_bytes \
        - plan.headroom_bytes - plan.draft_weights_bytes
    # The draft's KV takes its share of every token: tokens are priced with it.
    per_token = plan.kv_bytes_per_token * (1 + plan.draft_kv_bytes / max(1, plan.kv_cache_bytes))
    kv_src = ("auto" if plan.kv_auto
              else f"GLOWLM_CPU_KVCACHE_SPACE={config.kv_cache_space_gib:g}")
    where = f"rank {rank} of {world}" + (f" (NUMA node {node})" if node is not None else "")
    head = (f"the model does not fit in memory: {where} needs "
            f"{fmt_bytes(plan.needed_bytes)} (weights {fmt_bytes(plan.weights_bytes)} in "
            f"{str(dtype).removeprefix('torch.')}"
            + (f" + LoRA slots {fmt_bytes(plan.lora_bytes)} ({plan.lora_slots}: --max-loras x "
               "--max-lora-rank)" if plan.lora_bytes else "")
            + f" + KV cache {fmt_bytes(plan.kv_cache_bytes)} ({kv_src})"
            + (f" + draft model {fmt_bytes(plan.draft_weights_bytes)} weights, KV cache "
               f"{fmt_bytes(plan.draft_kv_bytes)} (its share of the KV space)"
               if plan.draft_bytes else "")
            + f" + activations {fmt_bytes(plan.activation_bytes)} + headroom "
            f"{fmt_bytes(plan.headroom_bytes)}) but has {fmt_bytes(plan.available_bytes)} "
            f"({plan.available_source}).")
    if spare < per_token * config.block_size:
        return (f"{head} Weights and activations alone leave no room for a KV cache: no "
                f"--max-model-len fits. Change: use {smaller}, or a machine with more memory.")
    tokens = int(spare // per_token) // config.block_size * config.block_size
    capped = ", the model's own limit" if tokens >= model_limit else ""
    tokens = min(tokens, model_limit)
    return (f"{head} Change one of: GLOWLM_CPU_KVCACHE_SPACE to at most "
            f"{int(spare / GIB * 100) / 100:g} GiB (or 'auto'); {smaller}. With the KV cache cut "
            f"to fit, the largest --max-model-len is {tokens} tokens{capped} (KV cache "
            f"{fmt_bytes(int(tokens * per_token))}).")


def lora_slot_bytes(dims: ModelDims, dtype: torch.dtype, max_loras: int, max_rank: int,
                    tp: int = 1, layers: int | None = None) -> int:
    """What :class:`glowlm.lora.slots.LoRASlots` allocates for the decoder layers of
    ``dims`` (the Llama layout: q|k|v, o, gate|up, down), one rank's shards."""
    r, h, i = max_rank, dims.hidden, dims.intermediate
    q, kv = dims.heads * dims.head_dim, max(dims.kv_heads, tp) * dims.head_dim
    per_layer = (3 * r * h + 3 * r * (q + 2 * kv) // tp     # q|k|v: A full, B's rows
                 + r * q // tp + r * h                      # o: A's columns, B full
                 + 2 * r * h + 2 * r * 2 * i // tp          # gate|up
                 + r * i // tp + r * h)                     # down
    elem = torch.empty((), dtype=dtype).element_size()
    return max_loras * per_layer * (dims.layers if layers is None else layers) * elem


def plan_memory(info: Any, dtype: torch.dtype, config: Any, max_model_len: int,
                *, rank: int = 0, topo: Any = None, node: int | None = None,
                meminfo: str | None = None, sharing: int = 1,
                seq_tokens: int | None = None, draft: Any = None) -> MemoryPlan:
    """Size ``rank``'s KV cache and check its weight shard + KV + activations fit in
    what its NUMA node (or the machine) has; before loading.

    Raises MemoryPlanError naming the rank and node, with the numbers, what to change
    and the largest ``--max-model-len`` that fits. ``topo``/``node``/``meminfo``/
    ``sharing`` (ranks placed on the same memory) replace the live machine in tests.
    ``seq_tokens``: the KV tokens one sequence holds at once, when less than
    ``max_model_len`` (a sliding window on every layer; ``setup.sequence_kv_tokens``).
    ``draft``: the draft model's directory (speculative ``draft_model``): its weights
    count (unsharded, in ``dtype``), and the KV space is split between the two caches
    in proportion to their bytes per token, so both hold the same tokens.
    """
    from glowlm.distributed.parallel import stage_layers

    world = config.world_size
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if topo is None:
        # This host's ranks in its binding plan (data-parallel replicas, several hosts).
        num, index = config.binding_slot(rank)
        topo, node, sharing = rank_placement(num, config.online, index)
    dims = model_dims(info.hf_config)
    total_weights, largest, source = weight_bytes(info, dtype)
    tied = bool(getattr(info.hf_config, "tie_word_embeddings", False))
    weights = rank_weight_bytes(total_weights, dims, dtype, tp, pp, tied)
    stage = len(stage_layers(dims.layers, rank // tp, pp)) if pp > 1 else dims.layers
    kv_dtype = resolve_kv_cache_dtype(getattr(config, "kv_cache_dtype", "auto"), dtype)
    per_token = kv_bytes_per_token(dataclasses.replace(dims, layers=max(1, stage)), kv_dtype,
                                   tp)
    lora = 0
    if getattr(config, "enable_lora", False):
        lora = lora_slot_bytes(dims, dtype, config.max_loras, config.max_lora_rank, tp,
                               max(1, stage))
        weights += lora  # sized like weights for every check below; shown apart
    draft_weights = draft_per_token = 0
    if draft is not None:
        draft_weights, draft_largest, _ = weight_bytes(draft, dtype)
        largest = max(largest, draft_largest)
        draft_per_token = kv_bytes_per_token(model_dims(draft.hf_config), kv_dtype)
        weights += draft_weights  # sized like weights for every check below; shown apart
    both = per_token + draft_per_token
    available, where = available_memory(topo, node, meminfo)
    if sharing > 1:
        available //= sharing
        where = f"1/{sharing} of {where}, shared by {sharing} ranks"
    useful_kv = config.max_num_seqs * (seq_tokens or max_model_len) * both
    auto = config.kv_cache_space_gib is None
    if auto:
        # Activations grow with the KV in use (gathered K/V) by at most 2/layers of it, so
        # the share left over after the KV (1 - AUTO_KV_SHARE) always covers that growth.
        act0 = max(activation_bytes(dims, dtype, config, max_model_len, 0), 2 * largest)
        spare = available - weights - act0 - HEADROOM_BYTES
        kv = max(0, min(int(AUTO_KV_SHARE * spare), useful_kv))
    else:
        kv = int(config.kv_cache_space_gib * GIB)
    act = max(activation_bytes(dims, dtype, config, max_model_len, min(kv, useful_kv)),
              2 * largest)
    fit_tokens = max(0, available - weights - act - HEADROOM_BYTES) // max(1, both)
    draft_kv = kv * draft_per_token // both
    kv -= draft_kv
    plan = MemoryPlan(kv, weights - lora - draft_weights, act, HEADROOM_BYTES, available,
                      where, per_token, auto,
                      int(min(fit_tokens, info.max_position_embeddings)), source,
                      str(kv_dtype).removeprefix("torch."), lora,
                      f"{config.max_loras} x rank {config.max_lora_rank}" if lora else "",
                      draft_weights, draft_kv)
    if plan.needed_bytes > available or (auto and kv < per_token * config.block_size):
        raise MemoryPlanError(_fits_message(plan, config, dtype, world,
                                            info.max_position_embeddings,
                                            bool(info.quantization_config), rank, node))
    return plan
