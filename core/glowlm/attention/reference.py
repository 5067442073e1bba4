"""Core's pure-PyTorch paged attention: the reference every compiled backend matches.

Decodes are attended in one batched call over gathered blocks with a length
mask; each prefill chunk is attended on its own (there are few per step,
bounded by the token budget). Math goes through ``scaled_dot_product_attention``,
which accumulates in float32 on CPU.

Layers with a sliding window (``AttentionLayerSpec.sliding_window``) gather only
the blocks that hold a key some query of the step can still see, and mask the
rest of the first of those blocks. Layers with soft-capped scores
(``logits_soft_cap``, Gemma 2) attend written out in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glowlm.attention.backend import (
    AttentionBackend,
    AttentionLayerSpec,
    AttentionMetadata,
    dequantize_int8_rows,
    to_cache,
)


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor, block_size: int) -> None:
    """Scatter new K/V rows into ``[2, blocks, kv_heads, block, head]`` at their slots."""
    blocks = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offsets = slot_mapping - blocks * block_size
    kv_cache[0, blocks, :, offsets] = to_cache(key, kv_cache.dtype)
    kv_cache[1, blocks, :, offsets] = to_cache(value, kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int,
              first_block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[seqs, kv_heads, tokens, head]`` K and V for each row of ``block_tables``: the
    positions ``first_block * block_size ... num_tokens - 1`` (a window skips the rest);
    an int8 cache's rows come back dequantized, in fp32."""
    _, _, heads, block_size, head = kv_cache.shape
    nblocks = -(-num_tokens // block_size)
    table = block_tables[:, first_block:nblocks].long()
    width = table.shape[1] * block_size
    k = kv_cache[0][table]  # [seqs, nblocks, heads, block, head]
    v = kv_cache[1][table]
    k = k.permute(0, 2, 1, 3, 4).reshape(table.shape[0], heads, width, head)
    v = v.permute(0, 2, 1, 3, 4).reshape(table.shape[0], heads, width, head)
    keep = num_tokens - first_block * block_size
    k, v = k[:, :, :keep], v[:, :, :keep]
    if kv_cache.dtype == torch.int8:  # rows of values and their scale: widen to fp32
        k, v = dequantize_int8_rows(k), dequantize_int8_rows(v)
    return k, v


def _decode_window(metadata: AttentionMetadata, window: int) -> tuple[int, torch.Tensor]:
    """First block any decode row still sees, and the ``[decodes, 1, 1, keys]`` mask of
    the keys from there (once per step and window size)."""
    key = f"decode_window_{window}"
    if key not in metadata.extras:
        lens = metadata.seq_lens_list[:metadata.num_decodes]
        first = min(max(0, n - window) for n in lens) // metadata.block_size
        pos = torch.arange(first * metadata.block_size, max(lens))
        seq = torch.tensor(lens)[:, None]
        mask = (pos[None, :] < seq) & (pos[None, :] >= seq - window)
        metadata.extras[key] = (first, mask[:, None, None, :])
    return metadata.extras[key]  # type: ignore[return-value]


def _attend(layer: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Softmax attention of ``q`` ``[seqs, heads, queries, head]`` over ``k``/``v``
    ``[seqs, kv_heads, keys, head]``; ``mask`` is True where a key is visible."""
    if layer.logits_soft_cap is not None:
        return _attend_capped(layer, q, k, v, mask, causal)
    return F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, is_causal=causal, scale=layer.scale,
        enable_gqa=layer.num_heads != layer.num_kv_heads)


def _attend_capped(layer: AttentionLayerSpec, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """:func:`_attend` with the scores soft-capped (``scaled_dot_product_attention``
    has no cap): scores, cap and softmax in float32, as transformers' eager Gemma 2."""
    group = layer.num_heads // layer.num_kv_heads
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    cap = float(layer.logits_soft_cap)  # type: ignore[arg-type]
    scores = torch.tanh(q.float() @ kf.transpose(-1, -2) * (layer.scale / cap)) * cap
    if causal:
        queries, keys = scores.shape[-2], scores.shape[-1]
        mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ vf).to(q.dtype)


class ReferenceAttentionBackend(AttentionBackend):
    name = "reference"

    def build_metadata(self, metadata: AttentionMetadata) -> AttentionMetadata:
        nd = metadata.num_decodes
        if nd:
            lens = metadata.seq_lens_list[:nd]
            longest = max(lens)
            pos = torch.arange(longest)
            # [decodes, 1, 1, longest]: True where a key position exists for that row.
            metadata.extras["decode_mask"] = (pos[None, :] < torch.tensor(lens)[:, None])[
                :, None, None, :]
            metadata.extras["decode_len"] = longest
        return metadata

    def forward(self, layer: AttentionLayerSpec, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
                ) -> torch.Tensor:
        if metadata.num_decodes and "decode_len" not in metadata.extras:
            # Metadata another backend built (one that hands this backend the layers it
            # does not cover): add this backend's per-step values once, here, so no
            # caller reads or builds them (they are private to this backend).
            self.build_metadata(metadata)
        write_kv(kv_cache, key, value, metadata.slot_mapping, metadata.block_size)
        out = torch.empty_like(query)
        nd, bs, window = metadata.num_decodes, metadata.block_size, layer.sliding_window
        if nd:
            longest = metadata.extras["decode_len"]
            first, mask = 0, metadata.extras["decode_mask"]
            if window is not None and longest > window:
                first, mask = _decode_window(metadata, window)
            k, v = gather_kv(kv_cache, metadata.block_tables[:nd], longest, first)
            q = query[:nd].unsqueeze(2)  # [decodes, heads, 1, head]
            out[:nd] = _attend(layer, q, k, v, mask, False).squeeze(2)
        qsl, lens = metadata.query_start_loc_list, metadata.seq_lens_list
        for i in range(nd, metadata.num_seqs):
            start, end, ctx = qsl[i], qsl[i + 1], lens[i]
            qlen = end - start
            # Only a window shorter than the context hides anything (query q sees p > q - w).
            windowed = window is not None and ctx > window
            first = max(0, ctx - qlen - window + 1) // bs if windowed else 0
            k, v = gather_kv(kv_cache, metadata.block_tables[i:i + 1], ctx, first)
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, heads, qlen, head]
            if qlen == ctx and not windowed:
                mask, causal = None, True
            else:  # query j (position ctx - qlen + j) sees keys <= its position
                kpos = torch.arange(first * bs, ctx)[None, :]
                qpos = torch.arange(ctx - qlen, ctx)[:, None]
                mask, causal = kpos <= qpos, False
                if windowed:
                    mask &= kpos > qpos - window
            out[start:end] = _attend(layer, q, k, v, mask, causal).squeeze(0).transpose(0, 1)
        return out.flatten(1)
