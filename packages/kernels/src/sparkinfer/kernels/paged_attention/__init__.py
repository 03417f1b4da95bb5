"""Paged KV-cache attention: cache write, causal varlen prefill, split-KV decode and a block
drafter's rows (each in its own key range)."""

from sparkinfer.kernels.paged_attention.block import paged_attention_block
from sparkinfer.kernels.paged_attention.cache_write import write_kv_cache
from sparkinfer.kernels.paged_attention.decode import paged_attention_decode
from sparkinfer.kernels.paged_attention.prefill import paged_attention_prefill
from sparkinfer.kernels.paged_attention.ref import (
    paged_attention_block_ref,
    paged_attention_decode_ref,
    paged_attention_prefill_ref,
    write_kv_cache_ref,
)

__all__ = [
    "paged_attention_block",
    "paged_attention_block_ref",
    "paged_attention_decode",
    "paged_attention_decode_ref",
    "paged_attention_prefill",
    "paged_attention_prefill_ref",
    "write_kv_cache",
    "write_kv_cache_ref",
]
