"""Core's pure-PyTorch paged attention: the reference every compiled backend matches.

Decodes are attended in one batched call over gathered blocks with a length
mask; each prefill chunk is attended on its own (there are few per step,
bounded by the token budget). Math goes through ``scaled_dot_product_attention``,
which accumulates in float32 on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glowlm.attention.backend import AttentionBackend, AttentionLayerSpec, AttentionMetadata


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor, block_size: int) -> None:
    """Scatter new K/V rows into ``[2, blocks, kv_heads, block, head]`` at their slots."""
    blocks = torch.div(slot_mapping, block_size, rounding_mode="floor")
    offsets = slot_mapping - blocks * block_size
    kv_cache[0, blocks, :, offsets] = key.to(kv_cache.dtype)
    kv_cache[1, blocks, :, offsets] = value.to(kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[seqs, kv_heads, num_tokens, head]`` K and V for each row of ``block_tables``."""
    _, _, heads, block_size, head = kv_cache.shape
    nblocks = -(-num_tokens // block_size)
    table = block_tables[:, :nblocks].long()
    k = kv_cache[0][table]  # [seqs, nblocks, heads, block, head]
    v = kv_cache[1][table]
    k = k.permute(0, 2, 1, 3, 4).reshape(table.shape[0], heads, nblocks * block_size, head)
    v = v.permute(0, 2, 1, 3, 4).reshape(table.shape[0], heads, nblocks * block_size, head)
    return k[:, :, :num_tokens], v[:, :, :num_tokens]


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
        write_kv(kv_cache, key, value, metadata.slot_mapping, metadata.block_size)
        out = torch.empty_like(query)
        nd = metadata.num_decodes
        gqa = layer.num_heads != layer.num_kv_heads
        if nd:
            k, v = gather_kv(kv_cache, metadata.block_tables[:nd], metadata.extras["decode_len"])
            q = query[:nd].unsqueeze(2)  # [decodes, heads, 1, head]
            o = F.scaled_dot_product_attention(
                q, k.to(q.dtype), v.to(q.dtype), attn_mask=metadata.extras["decode_mask"],
                scale=layer.scale, enable_gqa=gqa)
            out[:nd] = o.squeeze(2)
        qsl, lens = metadata.query_start_loc_list, metadata.seq_lens_list
        for i in range(nd, metadata.num_seqs):
            start, end, ctx = qsl[i], qsl[i + 1], lens[i]
            qlen = end - start
            k, v = gather_kv(kv_cache, metadata.block_tables[i:i + 1], ctx)
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, heads, qlen, head]
            if qlen == ctx:
                mask, causal = None, True
            else:  # chunk continues a prefix: query j sees keys <= ctx - qlen + j
                kpos = torch.arange(ctx)
                qpos = torch.arange(ctx - qlen, ctx)
                mask, causal = (kpos[None, :] <= qpos[:, None]), False
            o = F.scaled_dot_product_attention(
                q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, is_causal=causal,
                scale=layer.scale, enable_gqa=gqa)
            out[start:end] = o.squeeze(0).transpose(0, 1)
        return out.flatten(1)
