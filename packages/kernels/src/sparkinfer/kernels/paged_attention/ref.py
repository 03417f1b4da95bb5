"""Plain-torch paged attention: the specification the Triton kernels are tested against."""

from __future__ import annotations

import torch


def write_kv_cache_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K and V in its cache row, in place.

    Args:
        k, v: [T, HKV, D] new keys and values.
        k_cache, v_cache: [num_blocks, block_size, HKV, D], same dtype as k and v.
        slot_mapping: [T] int64 flat row block * block_size + offset; -1 skips the token.
    """
    block_size = k_cache.shape[1]
    for t in range(k.shape[0]):
        slot = int(slot_mapping[t])
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        k_cache[block, offset] = k[t]
        v_cache[block, offset] = v[t]


def _gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, context_len: int
) -> torch.Tensor:
    """Rows 0..context_len-1 of one sequence as [context_len, HKV, D] fp32."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:context_len].float()


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal GQA attention of q [N, H, D] at absolute positions [N] over k, v [L, HKV, D], fp32."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, H, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale  # [H, N, L]
    allowed = torch.arange(k.shape[0], device=k.device)[None, :] <= positions[:, None]  # [N, L]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, v)  # [N, H, D]


def paged_attention_prefill_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    cached_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
    index_cache: dict[str, tuple[torch.Tensor, ...]] | None = None,
) -> torch.Tensor:
    """Causal attention of a packed batch of new tokens over a paged KV cache.

    The new tokens' K and V must already be in the cache (see `write_kv_cache`). Token i of
    sequence b sits at absolute position cached_lens[b] + i and attends to cache positions
    0..cached_lens[b] + i of that sequence. Query head h reads KV head h // (H // HKV).

    Args:
        q: [T, H, D] queries of the new tokens, sequence b in rows cu_seqlens[b]:cu_seqlens[b+1].
        k_cache, v_cache: [num_blocks, block_size, HKV, D].
        cu_seqlens: [B+1] int32 offsets of each sequence's new tokens.
        cached_lens: [B] int32 tokens cached before this step.
        block_tables: [B, max_blocks] int32 cache blocks of each sequence, in order.
        scale: softmax scale, usually D ** -0.5.
        gate: optional [T, H, D]; the output is multiplied by sigmoid(gate).
        index_cache: unused here (the fast op keeps its query-tile map there between calls).

    Returns:
        o: [T, H, D] in q.dtype (softmax and accumulation in fp32).
    """
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(cu_seqlens.shape[0] - 1):
        start, end = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        if end == start:
            continue
        cached = int(cached_lens[b])
        context_len = cached + end - start
        k = _gather_context(k_cache, block_tables[b], context_len)
        v = _gather_context(v_cache, block_tables[b], context_len)
        positions = torch.arange(cached, context_len, device=q.device)
        o[start:end] = _attend(q[start:end], k, v, positions, scale)
    if gate is not None:
        o = o * torch.sigmoid(gate.float())
    return o.to(q.dtype)


def paged_attention_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one new token per sequence over its first context_lens[b] cached positions.

    The new token's K and V must already be in the cache. A row with context_lens[b] == 0 is
    padding and its output is zero.

    Args:
        q: [B, H, D] one query per sequence.
        k_cache, v_cache: [num_blocks, block_size, HKV, D].
        context_lens: [B] int32 cached positions to attend to (including the new token).
        block_tables: [B, max_blocks] int32 cache blocks of each sequence, in order.
        scale: softmax scale, usually D ** -0.5.
        gate: optional [B, H, D]; the output is multiplied by sigmoid(gate).

    Returns:
        o: [B, H, D] in q.dtype (softmax and accumulation in fp32).
    """
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        context_len = int(context_lens[b])
        if context_len == 0:
            continue
        k = _gather_context(k_cache, block_tables[b], context_len)
        v = _gather_context(v_cache, block_tables[b], context_len)
        positions = torch.tensor([context_len - 1], device=q.device)
        o[b] = _attend(q[b : b + 1], k, v, positions, scale)[0]
    if gate is not None:
        o = o * torch.sigmoid(gate.float())
        o[context_lens == 0] = 0.0
    return o.to(q.dtype)


def paged_attention_block_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """Attention of each sequence's block of S rows (the last S of its context_lens[b] cached
    positions) over its cache: row j, at q = context_lens[b] - S + j, sees key k when k <
    context_lens[b], |q - k| < window with a window, and k <= q if causal.

    Args:
        q: [B, S, H, D] the block rows' queries.
        k_cache, v_cache: [num_blocks, block_size, HKV, D].
        context_lens: [B] int32 cached positions through each block's last row.
        block_tables: [B, max_blocks] int32 cache blocks of each sequence, in order.
        scale: softmax scale; window, is_causal: as above.

    Returns:
        o: [B, S, H, D] in q.dtype (softmax and accumulation in fp32; a row that sees no key
        gets zeros).
    """
    b, s, h, _ = q.shape
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i in range(b):
        n = int(context_lens[i])
        k = _gather_context(k_cache, block_tables[i], n).repeat_interleave(h // k_cache.shape[2], 1)
        v = _gather_context(v_cache, block_tables[i], n).repeat_interleave(h // v_cache.shape[2], 1)
        q_pos = torch.arange(n - s, n, device=q.device)[:, None]  # [S, 1]
        k_pos = torch.arange(n, device=q.device)[None, :]
        seen = k_pos < n
        if window is not None:
            seen = seen & (q_pos - k_pos < window) & (k_pos - q_pos < window)
        if is_causal:
            seen = seen & (k_pos <= q_pos)
        scores = torch.einsum("shd,lhd->hsl", q[i].float(), k) * scale
        probs = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1).nan_to_num(0.0)
        o[i] = torch.einsum("hsl,lhd->shd", probs, v)
    return o.to(q.dtype)
