"""The block drafter's paged attention against its reference: windows, causal blocks, GQA,
shuffled pages; a sequence's bits alone and in a batch (GPU)."""

import inspect

import pytest
import torch
from sparkinfer.kernels._triton import MIN_DOT_TILE
from sparkinfer.kernels.paged_attention.block import block_tiles, paged_attention_block
from sparkinfer.kernels.paged_attention.ref import paged_attention_block_ref

# bf16 outputs: the CPU interpreter truncates casts to bf16 instead of rounding them.
BF16_ATOL = BF16_RTOL = 3e-2


def _blocks(lens, *, s=5, heads=(8, 2), d=32, block_size=16, dtype=torch.float32,
            device="cpu", seed=0):  # fmt: skip
    """Random caches holding each sequence's lens[b] positions (context then its block of s) in
    shuffled pages, and the block rows' queries [B, s, H, D]."""
    g = torch.Generator().manual_seed(seed)
    h, hkv = heads
    max_blocks = max(-(-n // block_size) for n in lens) + 1  # a spare column of unused pages
    num_blocks = len(lens) * max_blocks + 2
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)[: len(lens) * max_blocks]
    t = {
        "q": torch.randn(len(lens), s, h, d, generator=g).to(dtype),
        "k_cache": k_cache, "v_cache": v_cache,
        "context_lens": torch.tensor(lens, dtype=torch.int32),
        "block_tables": perm.view(len(lens), max_blocks).to(torch.int32),
    }  # fmt: skip
    return {name: x.to(device) for name, x in t.items()}


def _run(fn, b, **kw):
    return fn(b["q"], b["k_cache"], b["v_cache"], context_lens=b["context_lens"],
              block_tables=b["block_tables"], scale=0.3, **kw)  # fmt: skip


def test_signature_matches_the_reference():
    assert inspect.signature(paged_attention_block) == inspect.signature(paged_attention_block_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("window", "is_causal"),
    [(None, False), (3, False), (7, False), (40, False), (None, True), (3, True)],
)
def test_block_attention_matches_the_reference(dtype, window, is_causal, assert_close):
    """Contexts shorter than a block plus the window, longer, and across tiles and pages."""
    b = _blocks([5, 12, 37, 70], dtype=dtype)
    got = _run(paged_attention_block, b, window=window, is_causal=is_causal)
    want = _run(paged_attention_block_ref, b, window=window, is_causal=is_causal)
    if dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), want.float(), atol=BF16_ATOL, rtol=BF16_RTOL)
    else:
        assert_close(got, want)


def test_the_open_block_is_the_decode_of_each_row():
    """Without window or causality every block row sees the whole context and block: the
    reference equals a plain softmax over all of the sequence's keys."""
    b = _blocks([9, 30], s=3, heads=(4, 4))
    got = _run(paged_attention_block_ref, b)
    for i, n in enumerate([9, 30]):
        pages = b["block_tables"][i].long()
        k = b["k_cache"][pages].flatten(0, 1)[:n]  # [n, H, D]
        v = b["v_cache"][pages].flatten(0, 1)[:n]
        probs = torch.einsum("shd,lhd->hsl", b["q"][i], k).mul(0.3).softmax(-1)
        torch.testing.assert_close(got[i], torch.einsum("hsl,lhd->shd", probs, v))


@pytest.mark.parametrize(
    ("rows", "group", "d"),
    [(16, 3, 8), (7, 3, 8), (1, 1, 8), (16, 4, 128), (8, 4, 128), (7, 4, 128), (1, 1, 256)],
)
def test_block_tiles_are_valid_dot_tiles(rows, group, d):
    """The tests' shrunk drafters (6 heads over 2 of 8 dims) and the published ones (32 over 8
    of 128), blocks of 1 to 16: every tl.dot dimension a power of two of at least 16, covering
    its rows and head dim (a head dim of 8 was a K of 8, which Triton does not compile)."""
    tiles = block_tiles(rows, group, d)
    for tile, need in ((tiles.BR, rows * group), (tiles.BD, d)):
        assert tile >= max(need, MIN_DOT_TILE) and tile & (tile - 1) == 0


@pytest.mark.parametrize(("window", "is_causal"), [(None, False), (5, False), (None, True)])
def test_block_attention_with_a_head_dim_under_a_dot_tile(window, is_causal, assert_close):
    """A head dim of 8 (the shrunk drafters') runs in a 16-wide tile, the padding masked."""
    b = _blocks([9, 40], s=16, heads=(6, 2), d=8)
    got = _run(paged_attention_block, b, window=window, is_causal=is_causal)
    assert_close(got, _run(paged_attention_block_ref, b, window=window, is_causal=is_causal))


@pytest.mark.gpu
@pytest.mark.parametrize(("window", "is_causal"), [(None, False), (2048, False), (None, True)])
def test_cuda_block_attention_at_the_27b_drafters_shape(window, is_causal):
    """32 query heads over 8 KV heads of 128, a block of 8 and of 16, pages of 64, bf16,
    contexts past the window: within bf16 tolerance of the reference."""
    for s in (8, 16):
        b = _blocks([100, 3000, 4104], s=s, heads=(32, 8), d=128, block_size=64,
                    dtype=torch.bfloat16, device="cuda")  # fmt: skip
        got = _run(paged_attention_block, b, window=window, is_causal=is_causal)
        want = _run(paged_attention_block_ref, b, window=window, is_causal=is_causal)
        torch.testing.assert_close(got.float(), want.float(), atol=BF16_ATOL, rtol=BF16_RTOL)


# fp32 on the GPU: exact fp32 dots (tf32 ones, Triton's default, miss by about 1e-3).
FP32_EXACT_TOL = 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(("window", "is_causal"), [(None, False), (5, False), (None, True)])
@pytest.mark.parametrize(("heads", "d"), [((6, 2), 8), ((32, 8), 128)])
def test_cuda_fp32_block_attention_multiplies_in_fp32(window, is_causal, heads, d):
    """fp32 operands take IEEE dots, not tf32: the shrunk drafters' shape (6 heads over 2 of
    8 dims, a block of 8) and the published one, within fp32 rounding of the reference."""
    b = _blocks([9, 100, 300], s=8, heads=heads, d=d, device="cuda")
    got = _run(paged_attention_block, b, window=window, is_causal=is_causal)
    want = _run(paged_attention_block_ref, b, window=window, is_causal=is_causal)
    torch.testing.assert_close(got, want, atol=FP32_EXACT_TOL, rtol=FP32_EXACT_TOL)


@pytest.mark.gpu
def test_cuda_a_sequence_gives_the_same_bits_alone_and_in_a_batch(assert_same_bits_across_shapes):
    """One program per (sequence, KV head): a sequence's output never depends on the batch."""
    b = _blocks([100, 3000, 4104], s=8, heads=(32, 8), d=128, block_size=64,
                dtype=torch.bfloat16, device="cuda")  # fmt: skip
    batch = _run(paged_attention_block, b, window=2048)
    for i in range(3):
        alone = {**b, "q": b["q"][i : i + 1], "context_lens": b["context_lens"][i : i + 1],
                 "block_tables": b["block_tables"][i : i + 1]}  # fmt: skip
        assert_same_bits_across_shapes(
            _run(paged_attention_block, alone, window=2048), batch[i : i + 1]
        )
