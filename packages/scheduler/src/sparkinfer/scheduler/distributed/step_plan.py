"""A forward's inputs as one message: host lists in the header, every index tensor in one
int64 tensor, and the worker's rebuilt `ForwardBatch` over its own caches."""

from __future__ import annotations

from typing import Any

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch

# The ForwardBatch tensors a forward reads, in packing order, with their dtypes.
_FIELDS: tuple[tuple[str, torch.dtype], ...] = (
    ("positions", torch.int64),
    ("cu_seqlens", torch.int32),
    ("cached_lens", torch.int32),
    ("context_lens", torch.int32),
    ("block_tables", torch.int32),
    ("slot_mapping", torch.int64),
    ("state_slots", torch.int64),
    ("logits_indices", torch.int64),
)

CacheKey = tuple[int, int, int]


def cache_key(caches: ModelCaches) -> CacheKey:
    """(num_blocks, block_size, num_state_rows) of a cache set: a worker keeps caches of the same
    geometry, so each forward writes the same rows on every rank."""
    attention = next(iter(caches.attention.values()))
    linear = next(iter(caches.linear.values()))
    return attention.k.shape[0], attention.k.shape[1], linear.conv.shape[0]


def encode_forward(
    input_ids: torch.Tensor, batch: ForwardBatch, *, logits_rows_only: bool
) -> tuple[dict[str, Any], torch.Tensor]:
    """-> (header meta, packed int64 tensor [input_ids, then each field flattened])."""
    if batch.verify is not None:
        raise NotImplementedError("speculative verify steps do not run under tensor parallel")
    tensors = [input_ids.reshape(-1)] + [getattr(batch, name).reshape(-1) for name, _ in _FIELDS]
    meta = {
        "shapes": [tuple(input_ids.shape)] + [tuple(getattr(batch, n).shape) for n, _ in _FIELDS],
        "is_decode": batch.is_decode,
        "cu_seqlens_cpu": batch.cu_seqlens_cpu,
        "cached_lens_cpu": batch.cached_lens_cpu,
        "cache_key": cache_key(batch.caches),
        "logits_rows_only": logits_rows_only,
    }
    return meta, torch.cat([t.to(torch.int64) for t in tensors])


def decode_forward(
    meta: dict[str, Any], packed: torch.Tensor, caches: ModelCaches
) -> tuple[torch.Tensor, ForwardBatch]:
    """The inverse of `encode_forward` on a worker: (input_ids, batch over `caches`)."""
    shapes: list[tuple[int, ...]] = meta["shapes"]
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    parts = torch.split(packed, sizes)
    input_ids = parts[0].reshape(shapes[0])
    f = [
        part.reshape(shape).to(dtype)
        for (_, dtype), part, shape in zip(_FIELDS, parts[1:], shapes[1:], strict=True)
    ]
    batch = ForwardBatch(
        positions=f[0],
        cu_seqlens=f[1],
        cached_lens=f[2],
        context_lens=f[3],
        block_tables=f[4],
        slot_mapping=f[5],
        state_slots=f[6],
        logits_indices=f[7],
        is_decode=meta["is_decode"],
        caches=caches,
        cu_seqlens_cpu=meta["cu_seqlens_cpu"],
        cached_lens_cpu=meta["cached_lens_cpu"],
    )
    return input_ids, batch
