"""Attention over the paged KV cache: the backend interface and core's reference."""

from glowlm.attention.backend import AttentionBackend, AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata"]
