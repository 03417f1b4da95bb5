"""Input checks shared by the paged-attention launchers."""

from __future__ import annotations

import torch

ATTENTION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_cache(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Caches are [num_blocks, block_size, HKV, D] alike, block_size a power of two >= 16."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"{op}: k_cache {list(k_cache.shape)} and v_cache {list(v_cache.shape)} must both be "
            "[num_blocks, block_size, HKV, D]"
        )
    if k_cache.dtype not in ATTENTION_DTYPES or v_cache.dtype != k_cache.dtype:
        raise TypeError(
            f"{op}: caches are {k_cache.dtype} and {v_cache.dtype}; "
            "expected one of bf16, fp16, fp32"
        )
    block_size = k_cache.shape[1]
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"{op}: block_size is {block_size}; expected a power of two >= 16")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(
            f"{op}: caches have strides {k_cache.stride()} and {v_cache.stride()}; "
            "expected a unit stride along D"
        )


def check_heads(
    op: str, name: str, t: torch.Tensor, rows: int | None, k_cache: torch.Tensor
) -> None:
    """t is [rows, H, D] with H a multiple of the cache's HKV, cache dtype, unit last stride."""
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    if (
        t.dim() != 3
        or t.shape[2] != d
        or t.shape[1] % hkv
        or (rows is not None and t.shape[0] != rows)
    ):
        expected = f"[{rows if rows is not None else 'T'}, H, {d}] with H a multiple of HKV={hkv}"
        raise ValueError(f"{op}: {name} has shape {list(t.shape)}; expected {expected}")
    if t.dtype != k_cache.dtype:
        raise TypeError(f"{op}: {name} is {t.dtype} but the cache is {k_cache.dtype}")
    if t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} has strides {t.stride()}; expected a unit last stride")


def check_index(op: str, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    """An int32 index tensor of the given shape with a unit last stride (kernels read it so)."""
    if t.dtype != torch.int32 or tuple(t.shape) != shape:
        raise ValueError(f"{op}: {name} is {t.dtype} {list(t.shape)}; expected int32 {list(shape)}")
    if t.dim() and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has strides {t.stride()}; expected a unit last stride: "
            "call .contiguous() first"
        )


def check_block_tables(op: str, block_tables: torch.Tensor, num_seqs: int) -> None:
    """An int32 [num_seqs, max_blocks] table, unit stride along blocks (rows may be strided)."""
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"{op}: block_tables has shape {list(block_tables.shape)}; "
            f"expected [{num_seqs}, max_blocks]"
        )
    check_index(op, "block_tables", block_tables, tuple(block_tables.shape))
