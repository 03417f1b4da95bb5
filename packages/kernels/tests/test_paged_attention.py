"""Paged attention kernels against the references, and the references against transformers."""

import contextlib
import dataclasses
import inspect
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from sparkinfer.kernels._triton import MIN_DOT_TILE
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.paged_attention import (
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_prefill,
    paged_attention_prefill_ref,
    write_kv_cache,
    write_kv_cache_ref,
)
from sparkinfer.kernels.paged_attention import prefill as prefill_module
from sparkinfer.kernels.paged_attention.decode import (
    DecodeConfig,
    choose_max_splits,
    default_decode_config,
    launch_decode,
    merge_columns,
    num_multiprocessors,
    split_tiles,
)
from sparkinfer.kernels.paged_attention.prefill import (
    PrefillConfig,
    choose_kv_splits,
    default_prefill_config,
    is_heads_first,
    launch_prefill,
    prefill_variant_lengths,
)
from sparkinfer.kernels.paged_attention.prefill_tma import tma_layout_error
from transformers.models.qwen3_5.modeling_qwen3_5 import eager_attention_forward

DTYPES = [torch.float32, torch.bfloat16]
# bf16 outputs: the CPU interpreter truncates casts to bf16 instead of rounding them.
BF16_TOL = {"atol": 3e-2, "rtol": 3e-2}


def _check(actual: torch.Tensor, expected: torch.Tensor, assert_close) -> None:
    if actual.dtype == torch.bfloat16 and not actual.is_cuda:
        torch.testing.assert_close(actual.float(), expected.float(), **BF16_TOL)
    else:
        assert_close(actual, expected)


def _paged_batch(lens, cached, *, heads=(4, 2), d=32, block_size=16, dtype=torch.float32,
                 device="cpu", seed=0):  # fmt: skip
    """Random caches holding every sequence's context in shuffled blocks, plus q and gate views."""
    g = torch.Generator().manual_seed(seed)
    h, hkv = heads
    ctx = [c + n for c, n in zip(cached, lens, strict=True)]
    max_blocks = max(-(-c // block_size) for c in ctx) + 1  # one spare column of unused blocks
    num_blocks = len(lens) * max_blocks + 2
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)[: len(lens) * max_blocks]
    block_tables = perm.view(len(lens), max_blocks).to(torch.int32)
    # q and gate are the two halves of one [T, H, 2D] projection, as in the model.
    qg = torch.randn(sum(lens), h, 2 * d, generator=g).to(dtype)
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    t = {
        "q": qg[..., :d], "gate": qg[..., d:], "k_cache": k_cache, "v_cache": v_cache,
        "cu_seqlens": cu_seqlens, "cached_lens": torch.tensor(cached, dtype=torch.int32),
        "block_tables": block_tables, "context_lens": torch.tensor(ctx, dtype=torch.int32),
    }  # fmt: skip
    return {name: x.to(device) for name, x in t.items()}


def _prefill(fn, b, scale=0.3, use_gate=True):
    return fn(b["q"], b["k_cache"], b["v_cache"], cu_seqlens=b["cu_seqlens"],
              cached_lens=b["cached_lens"], block_tables=b["block_tables"], scale=scale,
              gate=b["gate"] if use_gate else None)  # fmt: skip


def _decode(fn, b, q, gate=None, scale=0.3):
    return fn(q, b["k_cache"], b["v_cache"], context_lens=b["context_lens"],
              block_tables=b["block_tables"], scale=scale, gate=gate)  # fmt: skip


def test_signatures_match_references():
    assert inspect.signature(write_kv_cache) == inspect.signature(write_kv_cache_ref)
    assert inspect.signature(paged_attention_prefill) == inspect.signature(
        paged_attention_prefill_ref
    )
    assert inspect.signature(paged_attention_decode) == inspect.signature(
        paged_attention_decode_ref
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_cache(dtype, assert_same_bits):
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(4, 16, 2, 8).to(dtype), torch.randn(4, 16, 2, 8).to(dtype)
    kv = torch.randn(6, 2, 2, 16).to(dtype)
    k, v = kv[:, 0, :, :8], kv[:, 1, :, 8:]  # strided views
    slots = torch.tensor([0, 15, 16, -1, 63, 33])
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    write_kv_cache_ref(k, v, expected_k, expected_v, slots)
    write_kv_cache(k, v, k_cache, v_cache, slots)
    assert_same_bits(k_cache, expected_k)
    assert_same_bits(v_cache, expected_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [1, 15, 16, 17, 63, 64, 65])
def test_prefill_lengths(dtype, length, assert_close):
    b = _paged_batch([length], [0], dtype=dtype, seed=length)
    _check(_prefill(paged_attention_prefill, b), _prefill(paged_attention_prefill_ref, b),
           assert_close)  # fmt: skip


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_prefill_varlen_with_cached_prefix(block_size, assert_close):
    """Odd ragged lengths whose cached prefixes end on both sides of block and tile boundaries."""
    lens, cached = [1, 63, 17, 40, 5], [0, 5, 31, 100, 64]
    b = _paged_batch(lens, cached, block_size=block_size, seed=block_size)
    _check(_prefill(paged_attention_prefill, b), _prefill(paged_attention_prefill_ref, b),
           assert_close)  # fmt: skip


def test_prefill_without_gate_and_larger_tiles(assert_close):
    b = _paged_batch([70, 33], [47, 129], block_size=32, heads=(6, 1), d=24, seed=3)
    config = PrefillConfig(BM=32, BN=32, num_warps=4, num_stages=1)
    args = (b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens"], b["cached_lens"],
            b["block_tables"], 0.2, None)  # fmt: skip
    assert_close(
        launch_prefill(*args, config), _prefill(paged_attention_prefill_ref, b, 0.2, False)
    )


def test_prefill_past_2048_tokens(assert_close):
    """A long new chunk and a long cached prefix, with the 128x64 tiles the GPU uses."""
    b = _paged_batch([2100, 9], [0, 2045], heads=(2, 1), d=16, block_size=64, seed=4)
    config = PrefillConfig(BM=128, BN=64, num_warps=4, num_stages=1)
    args = (b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens"], b["cached_lens"],
            b["block_tables"], 0.25, b["gate"])  # fmt: skip
    assert_close(launch_prefill(*args, config), _prefill(paged_attention_prefill_ref, b, 0.25))


def test_prefill_index_cache_builds_tile_map_once_per_cu_seqlens(monkeypatch, assert_same_bits):
    """Calls sharing an index_cache over one cu_seqlens tensor (the layers of a step) build the
    tile map once and give the bits of calls without it; another cu_seqlens rebuilds it."""
    built = []
    tile_map = prefill_module._tile_map

    def counted_tile_map(*args):
        built.append(args)
        return tile_map(*args)

    monkeypatch.setattr(prefill_module, "_tile_map", counted_tile_map)
    b = _paged_batch([1, 63, 17, 40], [0, 5, 31, 100], seed=6)
    index_cache: dict[str, tuple[torch.Tensor, ...]] = {}

    def call(cu_seqlens: torch.Tensor) -> torch.Tensor:
        return paged_attention_prefill(
            b["q"], b["k_cache"], b["v_cache"], cu_seqlens=cu_seqlens,
            cached_lens=b["cached_lens"], block_tables=b["block_tables"], scale=0.3,
            gate=b["gate"], index_cache=index_cache,
        )  # fmt: skip

    expected = _prefill(paged_attention_prefill, b)
    for _ in range(2):
        assert_same_bits(call(b["cu_seqlens"]), expected)
    assert len(built) == 2 and len(index_cache) == 1  # one build without the cache, one with it
    o = call(b["cu_seqlens"].clone())  # an equal but distinct tensor: rebuilt
    assert len(built) == 3
    assert_same_bits(o, expected)


def test_prefill_ref_matches_transformers_eager():
    """Causal prefill from an empty cache equals transformers' eager attention, sigmoid-gated."""
    b = _paged_batch([37], [0], heads=(6, 2), d=16, seed=5)
    ctx = 37
    k = b["k_cache"][b["block_tables"][0].long()].reshape(-1, 2, 16)[:ctx]
    v = b["v_cache"][b["block_tables"][0].long()].reshape(-1, 2, 16)[:ctx]
    mask = torch.full((ctx, ctx), float("-inf")).triu(1)
    module = SimpleNamespace(num_key_value_groups=3, training=False)
    hf, _ = eager_attention_forward(
        module, b["q"].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        mask[None, None], scaling=0.3,
    )  # fmt: skip
    hf = hf[0] * torch.sigmoid(b["gate"])
    torch.testing.assert_close(_prefill(paged_attention_prefill_ref, b), hf)


def _launch(b, config, scale=0.3, use_gate=True):
    return launch_prefill(b["q"], b["k_cache"], b["v_cache"], b["cu_seqlens"], b["cached_lens"],
                          b["block_tables"], scale, b["gate"] if use_gate else None,
                          config)  # fmt: skip


def _stale_nan_rows(b) -> None:
    """NaN in every cache row no sequence's context covers, as stale or never-written rows."""
    block_size = b["k_cache"].shape[1]
    is_live = torch.zeros(b["k_cache"].shape[:2], dtype=torch.bool, device=b["k_cache"].device)
    for row, ctx in zip(b["block_tables"].tolist(), b["context_lens"].tolist(), strict=True):
        for pos in range(ctx):
            is_live[row[pos // block_size], pos % block_size] = True
    b["k_cache"][~is_live] = float("nan")
    b["v_cache"][~is_live] = float("nan")


@pytest.fixture
def tma_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the pointer kernel unusable, so a passing test proves the TMA kernel ran."""
    monkeypatch.setattr(prefill_module, "_prefill_kernel", None)


TMA_TILES = PrefillConfig(BM=32, BN=16, num_warps=4, num_stages=1, use_tma=True)
TMA_PREFETCH = PrefillConfig(BM=32, BN=16, num_warps=4, num_stages=1, use_tma=True,
                             use_qk_prefetch=True)  # fmt: skip


@pytest.mark.parametrize("config", [TMA_TILES, TMA_PREFETCH], ids=["plain", "prefetch"])
@pytest.mark.parametrize("length", [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129])
def test_prefill_tma_lengths(length, config, tma_only, assert_close):
    """Lengths around the 16-key tile, 32-row query tile and 32-row cache block edges (fp16)."""
    b = _paged_batch([length], [0], block_size=32, dtype=torch.float16, seed=20 + length)
    assert_close(_launch(b, config), _prefill(paged_attention_prefill_ref, b))


@pytest.mark.parametrize("config", [TMA_TILES, TMA_PREFETCH], ids=["plain", "prefetch"])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_prefill_tma_varlen_cached_prefix_stale_rows(block_size, config, tma_only, assert_close):
    """Ragged lengths and prefixes around every boundary; unused cache rows hold NaN."""
    lens, cached = [1, 63, 17, 40, 5, 129, 64], [0, 5, 31, 100, 64, 2, 63]
    b = _paged_batch(lens, cached, block_size=block_size, dtype=torch.float16, seed=block_size)
    _stale_nan_rows(b)
    assert_close(_launch(b, config), _prefill(paged_attention_prefill_ref, b))


def test_prefill_tma_bf16_gqa_without_gate(tma_only, assert_close):
    b = _paged_batch([70, 33], [47, 129], block_size=64, heads=(6, 1), d=64,
                     dtype=torch.bfloat16, seed=21)  # fmt: skip
    config = PrefillConfig(BM=32, BN=32, num_warps=4, num_stages=2, use_tma=True)
    _check(_launch(b, config, 0.2, False), _prefill(paged_attention_prefill_ref, b, 0.2, False),
           assert_close)  # fmt: skip


def test_prefill_tma_past_2048_tokens_with_gpu_tiles(tma_only, assert_close):
    """A long new chunk and a long cached prefix with the 128x64 tiles of the GPU sweep."""
    b = _paged_batch([2100, 9], [0, 2045], heads=(2, 1), d=16, block_size=64,
                     dtype=torch.float16, seed=22)  # fmt: skip
    config = PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True,
                           use_qk_prefetch=True)  # fmt: skip
    assert_close(_launch(b, config, 0.25), _prefill(paged_attention_prefill_ref, b, 0.25))


def _kv_splits_case(splits, prefetch, device="cpu"):
    """(fast, reference) with keys cut into `splits` ranges, merged after: one-row chunks on long
    prefixes (the prefix-cache hit), prefixes shorter than one tile per split (empty splits), no
    prefix at all, lengths around the tile edges; stale cache rows hold NaN."""
    lens, cached = [1, 17, 40, 3, 33, 65, 16], [300, 0, 100, 5, 17, 2, 64]
    b = _paged_batch(lens, cached, block_size=32, dtype=torch.float16, device=device,
                     seed=30 + splits)  # fmt: skip
    _stale_nan_rows(b)
    config = PrefillConfig(BM=32, BN=16, num_warps=4, num_stages=1, use_tma=True,
                           use_qk_prefetch=prefetch, kv_splits=splits)  # fmt: skip
    return _launch(b, config), _prefill(paged_attention_prefill_ref, b)


@pytest.mark.parametrize(("splits", "prefetch"), [(2, False), (8, True)],
                         ids=["plain-2", "prefetch-8"])  # fmt: skip
def test_prefill_tma_kv_splits(splits, prefetch, tma_only, assert_close):
    assert_close(*_kv_splits_case(splits, prefetch))


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [2, 8, 32])
@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
def test_prefill_tma_kv_splits_on_gpu(splits, prefetch, tma_only, assert_close):
    assert_close(*_kv_splits_case(splits, prefetch, device="cuda"))


@pytest.mark.parametrize(
    ("num_tokens", "tile", "lanes", "expected"),
    [(16, 128, 4, 32), (54, 128, 4, 32), (54, 64, 24, 16), (128, 128, 24, 16),
     (300, 128, 24, 8), (512, 128, 24, 4), (1024, 128, 24, 2), (2048, 128, 24, 1),
     (8192, 128, 24, 1)],
)  # fmt: skip
def test_choose_kv_splits_at_the_27b_shape_on_an_h200(num_tokens, tile, lanes, expected):
    """24 query heads over 4 KV heads, 132 SMs: a prefix-cache hit's few rows get 32 splits
    packed (6 rows a token, a program per KV head) and 16 one head a tile, a chunk of a long
    prompt none."""
    rows = num_tokens * (24 // lanes)
    num_programs = (-(-rows // tile) + 1) * lanes
    assert choose_kv_splits(num_programs, 132) == expected


@pytest.mark.gpu
@pytest.mark.parametrize("is_invariant", [False, True], ids=["default", "batch_invariant"])
def test_prefill_few_rows_over_long_contexts_on_gpu(is_invariant, assert_close):
    """The default mode splits the keys of a step with few query tiles (16 splits here, 32 for
    packed tiles) and packs a KV head's query heads into the tiles' rows for at most 64 rows;
    a batch-invariant phase keeps one 128-row program per tile and head. Both against the
    reference."""
    for lens in ([54, 1, 10], [40, 1, 10, 13]):
        b = _paged_batch(lens, [32000, 4095, 0, 700][: len(lens)], heads=(24, 4), d=256,
                         block_size=64, dtype=torch.bfloat16, device="cuda", seed=16)  # fmt: skip
        _stale_nan_rows(b)
        phase = batch_invariant("prefill") if is_invariant else contextlib.nullcontext()
        scale = 256**-0.5
        with phase:
            config = default_prefill_config(b["q"], 4)
            is_packed = sum(lens) <= 64 and not is_invariant
            assert config.kv_splits == (1 if is_invariant else 32 if is_packed else 16)
            assert config.BM == 128
            assert config.pack_gqa is is_packed
            out = _prefill(paged_attention_prefill, b, scale)
        assert_close(out, _prefill(paged_attention_prefill_ref, b, scale))


def _packed_and_unpacked(heads, heads_first, device="cpu"):
    """A KV head's query heads packed into a tile's rows, and one head a tile: ragged lengths and
    prefixes, tiles holding the end of one token's heads and the start of the next's, stale NaN
    cache rows."""
    lens, cached = [1, 63, 17, 40, 5, 129], [0, 5, 31, 100, 64, 2]
    b = _paged_batch(lens, cached, heads=heads, block_size=32, dtype=torch.float16, device=device,
                     seed=50)  # fmt: skip
    _stale_nan_rows(b)
    config = dataclasses.replace(TMA_TILES, heads_fastest=heads_first)
    return b, _launch(b, dataclasses.replace(config, pack_gqa=True)), _launch(b, config)


@pytest.mark.parametrize(
    ("heads", "heads_first"),
    [((4, 2), False), ((6, 1), True), ((3, 3), False)],
    ids=["gqa2-tiles_first", "gqa6-heads_first", "mha-tiles_first"],
)
def test_prefill_tma_packed_heads_do_the_unpacked_arithmetic(
    heads, heads_first, tma_only, exact_dots, assert_close, assert_same_bits
):
    """Every packed row sees the same keys in the same tile order as unpacked (no key splits),
    and goes through the same operations: with dots whose rounding is the same for every shape
    (exact_dots), the same bits; and close to the reference."""
    b, packed, unpacked = _packed_and_unpacked(heads, heads_first)
    assert_same_bits(packed, unpacked)
    assert_close(packed, _prefill(paged_attention_prefill_ref, b))


@pytest.mark.gpu
@pytest.mark.parametrize("heads_first", [False, True], ids=["tiles_first", "heads_first"])
@pytest.mark.parametrize("heads", [(4, 2), (6, 1), (3, 3)], ids=["gqa2", "gqa6", "mha"])
def test_prefill_tma_packed_heads_match_the_unpacked_on_gpu(
    heads, heads_first, tma_only, assert_close
):
    """Within tolerance, not bit for bit: the packed and unpacked tiles are two kernels (q through
    registers or a TMA box, rows of several heads or one), which the compiler builds apart, free
    to contract multiplies into adds and to order a row's sums its own way in each; at 6 query
    heads a KV head the H200 gave other bits (the CPU test above shows that the arithmetic each
    row is given is the same). Nothing needs their bits to agree: a batch-invariant phase never
    packs (test_prefill_few_rows_over_long_contexts_on_gpu), and packing otherwise depends on the
    step's size, whose bits the default mode does not promise."""
    b, packed, unpacked = _packed_and_unpacked(heads, heads_first, device="cuda")
    assert_close(packed, unpacked)
    assert_close(packed, _prefill(paged_attention_prefill_ref, b))


@pytest.mark.parametrize("splits", [2, 16])
def test_prefill_tma_packed_heads_with_kv_splits(splits, tma_only, assert_close):
    """Packed rows over keys cut into ranges: a prefix-cache hit's few tokens over long and
    short prefixes (empty splits), without a gate."""
    lens, cached = [1, 9, 3, 33], [300, 100, 5, 0]
    b = _paged_batch(lens, cached, heads=(6, 1), block_size=32, dtype=torch.float16,
                     seed=60 + splits)  # fmt: skip
    _stale_nan_rows(b)
    config = dataclasses.replace(TMA_TILES, kv_splits=splits, pack_gqa=True)
    _check(_launch(b, config, 0.2, False), _prefill(paged_attention_prefill_ref, b, 0.2, False),
           assert_close)  # fmt: skip


@pytest.mark.parametrize("splits", [1, 4])
def test_prefill_tma_heads_first_grid_gives_the_same_bits(splits, tma_only, assert_same_bits):
    """The head-first grid runs the same programs in another order: identical outputs, with and
    without key splits, over ragged lengths and prefixes with stale NaN rows."""
    lens, cached = [1, 63, 17, 40], [0, 5, 31, 100]
    b = _paged_batch(lens, cached, block_size=32, dtype=torch.float16, seed=40 + splits)
    _stale_nan_rows(b)
    config = dataclasses.replace(TMA_TILES, kv_splits=splits)
    tiles_first = _launch(b, config)
    assert_same_bits(_launch(b, dataclasses.replace(config, heads_fastest=True)), tiles_first)


@pytest.mark.parametrize(
    ("num_tokens", "expected"), [(54, True), (4096, True), (6144, False), (8192, False)]
)
def test_heads_first_grids_are_the_few_wave_ones_at_the_27b_shape(num_tokens, expected):
    """24 query heads, 128-row tiles, 132 SMs: up to 8 waves (a 4K prompt's 6) run head-first."""
    assert is_heads_first((-(-num_tokens // 128) + 1) * 24, 132) is expected


def test_prefill_variant_lengths_are_the_shortest_step_of_each_config(monkeypatch):
    def config(q: torch.Tensor, num_kv_heads: int) -> PrefillConfig:
        n = q.shape[0]
        return PrefillConfig(use_tma=True, kv_splits=4 if n < 10 else 1, heads_fastest=n < 100)

    monkeypatch.setattr(prefill_module, "default_prefill_config", config)
    assert prefill_variant_lengths(24, 4, 256, 300, torch.device("cpu")) == (1, 10, 100)
    assert prefill_variant_lengths(24, 4, 256, 50, torch.device("cpu")) == (1, 10)


@pytest.mark.gpu
def test_prefill_variant_lengths_reach_every_config_of_27b_steps_on_gpu():
    """Each config a step of up to 8192 rows takes at 27B shapes is the config of one length."""
    device = torch.device("cuda")
    lengths = prefill_variant_lengths(24, 4, 256, 8192, device)
    probe = torch.empty(1, 24, 256, dtype=torch.bfloat16, device=device)

    def config(n: int) -> PrefillConfig:
        return default_prefill_config(probe.expand(n, -1, -1), 4)

    configs = {config(n) for n in lengths}
    assert len(configs) == len(lengths) and lengths[0] == 1
    assert all(config(n) in configs for n in range(1, 8193))


def test_prefill_tma_contiguous_q_matches_pointer_kernel(assert_close):
    """Dense heads (the model's normed q) through both kernels."""
    b = _paged_batch([50, 3], [14, 0], block_size=16, dtype=torch.float16, seed=23)
    b["q"] = b["q"].contiguous()
    pointer = _launch(b, PrefillConfig(BM=32, BN=16, num_warps=4, num_stages=1))
    assert tma_layout_error(b["q"], b["k_cache"], b["v_cache"], b["gate"], TMA_TILES) is None
    assert_close(_launch(b, TMA_TILES), pointer)


def _tma_fallbacks() -> dict[str, tuple[dict, PrefillConfig, str]]:
    """Layouts the TMA kernel cannot take, with the reason tma_layout_error gives."""
    base = {"block_size": 32, "dtype": torch.float16}
    sliced = _paged_batch([20], [3], seed=24, d=40, **base)
    sliced["q"], sliced["gate"] = sliced["q"][..., :32], sliced["gate"][..., :32]
    # Heads 40 apart in the cache: a [rows, HKV * D] view cannot address them.
    sliced["k_cache"], sliced["v_cache"] = sliced["k_cache"][..., :32], sliced["v_cache"][..., :32]
    strided = _paged_batch([20], [3], seed=25, **base)
    strided["q"] = torch.randn(20, 4, 36).half()[..., :32]  # 72-byte head stride
    shifted = _paged_batch([20], [3], seed=29, **base)
    shifted["q"] = torch.randn(20 * 4 * 32 + 1).half()[1:].view(20, 4, 32)  # base off by 2 bytes
    return {
        "fp32": (_paged_batch([20], [3], seed=26, block_size=32), TMA_TILES, "bf16 or fp16"),
        "block": (_paged_batch([20], [3], seed=27, **base),
                  PrefillConfig(BM=32, BN=64, num_warps=4, num_stages=1, use_tma=True),
                  "not a multiple of BN"),
        "head_dim": (_paged_batch([20], [3], seed=28, d=24, **base), TMA_TILES, "D=24"),
        "cache_strides": (sliced, TMA_TILES, "do not flatten"),
        "q_strides": (strided, TMA_TILES, "q base or strides (144, 36, 1)"),
        "q_base": (shifted, TMA_TILES, "q base"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case", ["fp32", "block", "head_dim", "cache_strides", "q_strides", "q_base"]
)
def test_prefill_tma_falls_back_to_pointer_kernel(case, monkeypatch, assert_close):
    b, config, reason = _tma_fallbacks()[case]
    error = tma_layout_error(b["q"], b["k_cache"], b["v_cache"], b["gate"], config)
    assert error is not None and reason in error
    monkeypatch.setattr(prefill_module, "launch_prefill_tma", None)
    _check(_launch(b, config), _prefill(paged_attention_prefill_ref, b), assert_close)


def test_prefill_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="BM is 24"):
        PrefillConfig(BM=24)
    with pytest.raises(ValueError, match="num_stages=0"):
        PrefillConfig(num_stages=0)
    with pytest.raises(ValueError, match="set use_tma=True"):
        PrefillConfig(use_qk_prefetch=True)
    with pytest.raises(ValueError, match="set use_tma=True"):
        PrefillConfig(kv_splits=2)
    with pytest.raises(ValueError, match="set use_tma=True"):
        PrefillConfig(heads_fastest=True)
    with pytest.raises(ValueError, match="set use_tma=True"):
        PrefillConfig(pack_gqa=True)
    with pytest.raises(ValueError, match="kv_splits is 3"):
        PrefillConfig(use_tma=True, kv_splits=3)


def _is_short_split_plan(b) -> bool:
    """The default mode cuts this batch's contexts into one-tile splits on the CPU interpreter."""
    config = default_decode_config(b["q"], b["k_cache"].shape[2])
    return config.MIN_SPLIT_LEN == config.BN


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_matches_ref(dtype, assert_close, assert_same_bits):
    """Contexts of 1, 15-17, 63-65 and several splits, plus a padding row (length 0)."""
    lens, cached = [1] * 9, [0, 14, 15, 16, 62, 63, 64, 200, 0]
    b = _paged_batch(lens, cached, dtype=dtype, seed=6)
    b["context_lens"][-1] = 0
    q = torch.randn(9, 4, 32).to(dtype)
    gate = torch.randn(9, 4, 32).to(dtype)
    out = _decode(paged_attention_decode, b, q, gate)
    _check(out, _decode(paged_attention_decode_ref, b, q, gate), assert_close)
    assert_same_bits(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [1, 15, 16, 17, 63, 64, 65, 200])
def test_decode_small_batch_short_splits(dtype, length, assert_close):
    """One sequence in the default mode: one-tile splits, up to the MAX_SPLITS cap at 200."""
    b = _paged_batch([1], [length - 1], dtype=dtype, seed=30 + length)
    assert _is_short_split_plan(b)
    _check(_decode(paged_attention_decode, b, b["q"], b["gate"]),
           _decode(paged_attention_decode_ref, b, b["q"], b["gate"]), assert_close)  # fmt: skip


@pytest.mark.parametrize("heads", [(4, 2), (3, 1)])
def test_decode_small_varlen_batch_short_splits(heads, assert_close, assert_same_bits):
    """Odd ragged contexts, a padding row among them, through the small-batch plan."""
    b = _paged_batch([1, 1, 1], [64, 0, 130], heads=heads, seed=31)
    b["context_lens"][1] = 0
    assert _is_short_split_plan(b)
    out = _decode(paged_attention_decode, b, b["q"], b["gate"])
    assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], b["gate"]))
    assert_same_bits(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "d"),
    [(96, 2, 8), (42, 2, 8), (6, 2, 8), (512, 8, 128), (256, 8, 128), (224, 8, 128),
     (24, 4, 256)],
)  # fmt: skip
def test_split_tiles_are_valid_dot_tiles(num_heads, num_kv_heads, d):
    """A block drafter's decode query packs its block rows x query heads of each KV head: the
    tests' shrunk drafters (16 or 7 rows x 3 heads of 8 dims over 2 KV heads), the published
    ones (16, 8 or 7 rows x 4 heads of 128 over 8) and the 27B target's (6 of 256 over 4): every
    tl.dot dimension a power of two of at least 16 covering its group and head dim (a head dim of
    8 was a K of 8, which Triton does not compile)."""
    tiles = split_tiles(num_heads, num_kv_heads, d)
    for tile, need in ((tiles.BG, num_heads // num_kv_heads), (tiles.BD, d)):
        assert tile >= max(need, MIN_DOT_TILE) and tile & (tile - 1) == 0


def test_decode_with_a_head_dim_under_a_dot_tile(assert_close):
    """A block drafter's packed rows at the shrunk drafters' shape (16 rows x 3 heads of 8 over 2
    KV heads): the head dim runs in a 16-wide tile, the padding masked."""
    b = _paged_batch([1, 1], [40, 150], heads=(96, 2), d=8, seed=9)
    out = _decode(paged_attention_decode, b, b["q"], b["gate"])
    assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], b["gate"]))


def test_decode_equals_prefill_last_row(assert_close):
    b = _paged_batch([1, 1], [40, 77], heads=(6, 2), d=16, block_size=32, seed=7)
    q = b["q"]
    dec = _decode(paged_attention_decode, b, q, b["gate"])
    assert_close(dec, _prefill(paged_attention_prefill, b))


def test_decode_long_context_with_gpu_split_plan(assert_close):
    """3000 keys: twelve 256-key splits of 64-key tiles, merged in order."""
    b = _paged_batch([1, 1], [2999, 700], heads=(4, 1), d=16, block_size=64, seed=8)
    config = DecodeConfig(BN=64, MIN_SPLIT_LEN=256, MAX_SPLITS=64, num_warps=4, num_stages=1)
    out = launch_decode(b["q"], b["k_cache"], b["v_cache"], b["context_lens"],
                        b["block_tables"], 0.25, None, config)  # fmt: skip
    assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], scale=0.25))


@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_tma_tiles_with_nan_in_stale_cache_rows(block_size, assert_close, assert_same_bits):
    """Descriptor tiles (fp16: the interpreter's descriptors take no bf16) over contexts ending on
    both sides of the 16-key tile and the block, with NaN in every cache row past a context: the
    pointer loads mask those rows, the descriptor path zeroes them."""
    b = _paged_batch([1] * 6, [0, 14, 15, 16, 31, 70], block_size=block_size,
                     dtype=torch.float16, seed=40 + block_size)  # fmt: skip
    for i, ctx in enumerate(b["context_lens"].tolist()):
        for pos in range(ctx, b["block_tables"].shape[1] * block_size):
            blk = b["block_tables"][i, pos // block_size]
            b["k_cache"][blk, pos % block_size] = float("nan")
            b["v_cache"][blk, pos % block_size] = float("nan")
    config = DecodeConfig(BN=16, MIN_SPLIT_LEN=32, MAX_SPLITS=8, num_warps=4, num_stages=1)
    args = (b["q"], b["k_cache"], b["v_cache"], b["context_lens"], b["block_tables"], 0.3)
    with_tma = launch_decode(*args, b["gate"], dataclasses.replace(config, use_tma=True))
    assert_same_bits(with_tma, launch_decode(*args, b["gate"], config))  # the same tiles
    assert_close(with_tma, _decode(paged_attention_decode_ref, b, b["q"], b["gate"]))


@pytest.mark.any_device
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_is_batch_invariant_in_batch_invariant_mode(dtype, assert_same_bits_on_gpu):
    """Inside batch_invariant("decode") a sequence's output is bit-identical alone or batched on
    the GPU (fp32 outputs show the split plan's rounding, which the default mode's plan
    changes); under the interpreter, whose dots of other batch sizes are numpy's, within
    tolerance (test_decode_config_keeps_the_fixed_plan_in_batch_invariant_mode checks the plan)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    b = _paged_batch([1, 1, 1, 1], [90, 3, 250, 33], dtype=dtype, device=device, seed=9)
    with batch_invariant("decode"):
        full = _decode(paged_attention_decode, b, b["q"], b["gate"])
        for i in range(4):
            alone = {**b, "context_lens": b["context_lens"][i : i + 1],
                     "block_tables": b["block_tables"][i : i + 1]}  # fmt: skip
            out = _decode(paged_attention_decode, alone, b["q"][i : i + 1], b["gate"][i : i + 1])
            assert_same_bits_on_gpu(out[0], full[i])


def test_decode_config_keeps_the_fixed_plan_in_batch_invariant_mode():
    q = torch.randn(1, 4, 32)
    fixed = DecodeConfig(BN=16, MIN_SPLIT_LEN=32, MAX_SPLITS=8, num_warps=4, num_stages=1)
    for phase in ("decode", "prefill"):
        with batch_invariant(phase):
            assert default_decode_config(q, 2) == fixed
    assert default_decode_config(q, 2).MIN_SPLIT_LEN == 16  # one sequence: one-tile splits
    assert num_multiprocessors(q.device) == 8


@pytest.mark.parametrize(
    ("num_seqs", "expected"),
    [(1, 64), (2, 32), (4, 16), (8, 8), (16, 4), (24, 2), (32, 2), (64, 1), (256, 1)],
)
def test_choose_max_splits_at_the_27b_shape_on_an_h200(num_seqs, expected):
    """4 KV heads, 132 SMs: about two programs an SM over a long context."""
    max_splits = choose_max_splits(num_seqs, 4, 132, DecodeConfig())
    assert max_splits == expected
    assert 132 <= num_seqs * 4 * max_splits <= 4 * 132 or max_splits == 1


def test_choose_max_splits_is_a_falling_power_of_two_within_the_config():
    config = DecodeConfig(MAX_SPLITS=16)
    caps = [choose_max_splits(n, 2, 40, config) for n in range(0, 200)]
    assert caps == sorted(caps, reverse=True)  # never more splits for a larger batch
    assert all(c & (c - 1) == 0 and 1 <= c <= 16 for c in caps)
    assert caps[0] == 16 and caps[-1] == 1


def test_launchers_reject_bad_inputs():
    b = _paged_batch([3], [0], seed=10)
    with pytest.raises(ValueError, match="block_size is 24"):
        write_kv_cache(torch.randn(2, 2, 32), torch.randn(2, 2, 32), torch.randn(3, 24, 2, 32),
                       torch.randn(3, 24, 2, 32), torch.tensor([0, 1]))  # fmt: skip
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache(torch.randn(2, 2, 32), torch.randn(2, 2, 32), b["k_cache"], b["v_cache"],
                       torch.tensor([0, 1], dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match="cu_seqlens"):
        paged_attention_prefill(b["q"], b["k_cache"], b["v_cache"],
                                cu_seqlens=b["cu_seqlens"].long(), cached_lens=b["cached_lens"],
                                block_tables=b["block_tables"], scale=0.1)  # fmt: skip
    with pytest.raises(ValueError, match="multiple of HKV"):
        paged_attention_decode(torch.randn(1, 3, 32), b["k_cache"], b["v_cache"],
                               context_lens=b["context_lens"], block_tables=b["block_tables"],
                               scale=0.1)  # fmt: skip
    with pytest.raises(TypeError, match=r"cache is torch\.float32"):
        paged_attention_decode(torch.randn(1, 4, 32).half(), b["k_cache"], b["v_cache"],
                               context_lens=b["context_lens"], block_tables=b["block_tables"],
                               scale=0.1)  # fmt: skip


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as t [N], read with stride 2 (every other element of a wider buffer)."""
    return torch.stack([t, torch.full_like(t, -7)], dim=1)[:, 0]


def test_launchers_reject_strided_index_tensors():
    # The kernels read index tensors with unit stride: a strided view would be read wrongly.
    b = _paged_batch([3, 2], [4, 0], seed=11)
    with pytest.raises(ValueError, match="context_lens has strides"):
        paged_attention_decode(b["q"][:2], b["k_cache"], b["v_cache"],
                               context_lens=_strided(b["context_lens"]),
                               block_tables=b["block_tables"], scale=0.1)  # fmt: skip
    with pytest.raises(ValueError, match="cached_lens has strides"):
        paged_attention_prefill(b["q"], b["k_cache"], b["v_cache"], cu_seqlens=b["cu_seqlens"],
                                cached_lens=_strided(b["cached_lens"]),
                                block_tables=b["block_tables"], scale=0.1)  # fmt: skip
    with pytest.raises(ValueError, match="cu_seqlens has strides"):
        paged_attention_prefill(b["q"], b["k_cache"], b["v_cache"],
                                cu_seqlens=_strided(b["cu_seqlens"]), cached_lens=b["cached_lens"],
                                block_tables=b["block_tables"], scale=0.1)  # fmt: skip
    k = torch.randn(2, 2, 32)
    with pytest.raises(ValueError, match="slot_mapping has strides"):
        write_kv_cache(k, k.clone(), b["k_cache"], b["v_cache"], _strided(torch.tensor([0, 1])))


@pytest.mark.gpu
@pytest.mark.parametrize("block_size", [16, 64])
def test_prefill_real_shapes_on_gpu(block_size, assert_close):
    lens, cached = [1, 127, 128, 129, 2100, 700], [0, 64, 1000, 1, 0, 3000]
    b = _paged_batch(lens, cached, heads=(24, 4), d=256, block_size=block_size,
                     dtype=torch.bfloat16, device="cuda", seed=11)  # fmt: skip
    scale = 256**-0.5
    assert_close(
        _prefill(paged_attention_prefill, b, scale), _prefill(paged_attention_prefill_ref, b, scale)
    )


@pytest.mark.gpu
def test_decode_rows_keep_their_bits_at_every_graph_batch_size_on_gpu():
    """Inside batch_invariant("decode") the first rows of a 64-sequence 27B-shaped batch give
    the same bits in batches of 1 to 64 (the graph buckets and between), since the split plan
    depends on each context's length alone."""
    cached = [(i * 997) % 4100 for i in range(64)]
    b = _paged_batch([1] * 64, cached, heads=(24, 4), d=256, block_size=64,
                     dtype=torch.bfloat16, device="cuda", seed=21)  # fmt: skip
    with batch_invariant("decode"):
        full = _decode(paged_attention_decode, b, b["q"], b["gate"], 256**-0.5)
        for m in (1, 2, 3, 8, 17, 24, 33, 48, 63):
            part = {**b, "context_lens": b["context_lens"][:m],
                    "block_tables": b["block_tables"][:m]}  # fmt: skip
            out = _decode(paged_attention_decode, part, b["q"][:m], b["gate"][:m], 256**-0.5)
            assert torch.equal(out, full[:m]), m


@pytest.mark.gpu
@pytest.mark.parametrize("is_invariant", [False, True], ids=["default", "batch_invariant"])
def test_decode_real_shapes_on_gpu(is_invariant, assert_close):
    cached = [0, 63, 64, 255, 256, 4095, 20000, 70000]
    b = _paged_batch([1] * 8, cached, heads=(24, 4), d=256, block_size=64,
                     dtype=torch.bfloat16, device="cuda", seed=12)  # fmt: skip
    scale = 256**-0.5
    phase = batch_invariant("decode") if is_invariant else contextlib.nullcontext()
    with phase:
        out = _decode(paged_attention_decode, b, b["q"], b["gate"], scale)
        assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], b["gate"], scale))
        for i in (0, 5, 7):
            alone = {**b, "context_lens": b["context_lens"][i : i + 1],
                     "block_tables": b["block_tables"][i : i + 1]}  # fmt: skip
            single = _decode(
                paged_attention_decode, alone, b["q"][i : i + 1], b["gate"][i : i + 1], scale
            )
            if is_invariant:
                assert torch.equal(single[0], out[i])
            else:  # one sequence runs up to 64 splits, the batch of 8 up to 8
                assert_close(single[0], out[i])


@pytest.mark.gpu
def test_decode_large_batch_plan_on_gpu(assert_close):
    """16 sequences at 4 KV heads: the default mode caps a context at 4 splits (on an H200) of
    64-key descriptor tiles; lengths on both sides of a tile, a block and a split, against the
    reference."""
    lens = [1, 31, 32, 33, 63, 64, 65, 255, 256, 257, 511, 512, 513, 2049, 4095, 4096]
    b = _paged_batch([1] * len(lens), [n - 1 for n in lens], heads=(24, 4), d=256,
                     block_size=64, dtype=torch.bfloat16, device="cuda", seed=15)  # fmt: skip
    config = default_decode_config(b["q"], 4)
    cap = choose_max_splits(16, 4, num_multiprocessors(b["q"].device), DecodeConfig())
    assert (config.BN, config.MIN_SPLIT_LEN, config.use_tma) == (64, 64, True)
    assert cap == config.MAX_SPLITS
    scale = 256**-0.5
    out = _decode(paged_attention_decode, b, b["q"], b["gate"], scale)
    assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], b["gate"], scale))


@pytest.mark.gpu
def test_decode_small_batch_plan_on_gpu(assert_close):
    """Four sequences in the default mode (every tile may start a split, at most 16 on an
    H200): 1 key, one tile, 4096 keys in 16 splits of 4 tiles, and past 40,000."""
    b = _paged_batch([1] * 4, [0, 63, 4095, 40000], heads=(24, 4), d=256, block_size=64,
                     dtype=torch.bfloat16, device="cuda", seed=14)  # fmt: skip
    scale = 256**-0.5
    config = default_decode_config(b["q"], 4)
    cap = choose_max_splits(4, 4, num_multiprocessors(b["q"].device), DecodeConfig())
    assert config.MIN_SPLIT_LEN == 64
    assert cap == config.MAX_SPLITS  # 16 on an H200
    out = _decode(paged_attention_decode, b, b["q"], b["gate"], scale)
    assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], b["gate"], scale))


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "d"), [((48, 2), 8), ((24, 4), 256)])
def test_decode_fp32_multiplies_in_fp32_on_gpu(heads, d):
    """fp32 operands take IEEE dots, not tf32 (Triton's default, about 1e-3 off): a block
    drafter's packed rows (a block of 8 x 3 query heads per KV head, 8 dims) and the 27B's
    heads, over one tile and several splits, within fp32 rounding of the reference."""
    b = _paged_batch([1] * 3, [8, 99, 4000], heads=heads, d=d, block_size=16, device="cuda",
                     seed=16)  # fmt: skip
    out = _decode(paged_attention_decode, b, b["q"], b["gate"])
    want = _decode(paged_attention_decode_ref, b, b["q"], b["gate"])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


PACKED_SPLIT_TILES = PrefillConfig(BM=64, BN=64, num_warps=4, num_stages=2, use_tma=True,
                                   pack_gqa=True, kv_splits=4, heads_fastest=True)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True),
        PrefillConfig(BM=128, BN=32, num_warps=8, num_stages=3, use_tma=True),
        PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True, use_qk_prefetch=True),
        PrefillConfig(BM=64, BN=64, num_warps=4, num_stages=2, use_tma=True),
        PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True, pack_gqa=True),
        PACKED_SPLIT_TILES,
    ],
)
def test_prefill_tma_real_shapes_on_gpu(config, tma_only, assert_close):
    lens, cached = [1, 63, 64, 65, 127, 128, 129, 2100, 700], [0, 1, 0, 64, 64, 1000, 1, 0, 3000]
    b = _paged_batch(lens, cached, heads=(24, 4), d=256, block_size=64, dtype=torch.bfloat16,
                     device="cuda", seed=13)  # fmt: skip
    _stale_nan_rows(b)
    assert tma_layout_error(b["q"], b["k_cache"], b["v_cache"], b["gate"], config) is None
    scale = 256**-0.5
    assert_close(_launch(b, config, scale), _prefill(paged_attention_prefill_ref, b, scale))


def test_decode_merge_spreads_a_heads_columns_over_programs(assert_close):
    """47 splits of 64 keys at D=128: two merge programs of 64 columns each per head."""
    assert merge_columns(128, 64) == 64
    b = _paged_batch([1, 1], [2999, 100], heads=(4, 1), d=128, block_size=64, seed=11)
    config = DecodeConfig(BN=64, MIN_SPLIT_LEN=64, MAX_SPLITS=64, num_warps=4, num_stages=1)
    out = launch_decode(b["q"], b["k_cache"], b["v_cache"], b["context_lens"],
                        b["block_tables"], 0.25, b["gate"], config)  # fmt: skip
    assert_close(out, _decode(paged_attention_decode_ref, b, b["q"], b["gate"], scale=0.25))


def _hopper_signature(fn, block_rows: int) -> dict[str, str]:
    """Argument types of one of this package's attention kernels by name, for a compile at 27B
    shapes (bf16, D=256): descriptors over 64-key K/V tiles and block_rows-row q/gate/o tiles."""

    def arg_type(name: str) -> str:
        if name in ("desc_k", "desc_v"):
            return "tensordesc<bf16[64,256]>"
        if name.startswith("desc_"):
            return f"tensordesc<bf16[{block_rows},256]>"
        if name in ("p_part_o", "p_part_ml"):
            return "*fp32"
        if name in ("p_q", "p_k", "p_v", "p_g", "p_gate", "p_o"):
            return "*bf16"
        return "*i32" if name.startswith("p_") else "fp32" if name == "qk_scale" else "i32"

    return {p.name: "constexpr" if p.is_constexpr else arg_type(p.name) for p in fn.params}


def compile_for_hopper() -> None:
    """Compile the CUDA defaults of the TMA prefill kernels and the decode kernels for sm_90 (no
    GPU needed): the interpreter runs code the compiler may still reject."""
    import triton
    import triton.language as tl
    from sparkinfer.kernels.paged_attention import decode, prefill_tma
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def compile_one(fn, block_rows: int, constants: dict, num_warps: int) -> None:
        constexprs = {(fn.arg_names.index(k),): v for k, v in constants.items()}
        src = ASTSource(fn=fn, signature=_hopper_signature(fn, block_rows), constexprs=constexprs)
        options = {"num_warps": num_warps, "num_stages": 2}
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

    prefill = {"GROUP": 6, "BLOCK_SIZE": 64, "D": 256, "BN": 64, "HAS_GATE": True,
               "USE_QK_PREFETCH": False, "DOT_DTYPE": tl.bfloat16}  # fmt: skip
    for kernel in (prefill_tma._prefill_tma_kernel, prefill_tma._prefill_tma_packed_kernel):
        for rows, warps, splits, heads_first in ((128, 8, 1, False), (128, 8, 16, True)):
            constants = {**prefill, "BM": rows, "KV_SPLITS": splits, "HEADS_FASTEST": heads_first}
            compile_one(kernel, rows, constants, warps)
    for max_splits in (64, 2):
        plan = {"D": 256, "BD": 256, "BN": 64, "MIN_SPLIT_LEN": 64, "MAX_SPLITS": max_splits,
                "USE_PDL": True}  # fmt: skip
        split = {**plan, "GROUP": 6, "BG": 16, "BLOCK_SIZE": 64, "TMA": True,
                 "DOT_DTYPE": tl.bfloat16, "DOT_PRECISION": "tf32"}  # fmt: skip
        compile_one(decode._decode_split_kernel, 64, split, 4)
        merge = {**plan, "DC": merge_columns(256, max_splits), "HAS_GATE": True}
        compile_one(decode._decode_merge_kernel, 64, merge, 4)


def test_tma_and_decode_kernels_compile_for_hopper():
    """The compiler, not the interpreter, on the kernels' CUDA configs: in a process of its own,
    since this one interprets Triton."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"import runpy; runpy.run_path({__file__!r})['compile_for_hopper']()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
