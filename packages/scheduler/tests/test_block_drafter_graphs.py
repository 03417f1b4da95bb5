"""The block drafter's proposal shapes: the keys buckets it reads (CPU), the same drafts at a
bucket as at the exact context (CPU), and its CUDA graphs replaying what an eager proposal gives,
padding rows included (GPU)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from scheduler_testing import TINY_DRAFTER_BLOCK, build_tiny_block_drafter, build_tiny_model
from sparkinfer.model.drafters.cache import DrafterCache, allocate_drafter_cache
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.scheduler.speculative.block_drafter import (
    KEY_BUCKETS_PER_DOUBLING,
    MIN_KEY_BUCKET,
    key_bucket,
)

PAGE, PAGES_PER_SEQ, BLOCK = 16, 40, TINY_DRAFTER_BLOCK


@pytest.mark.parametrize("page", [16, 64, 256, 1024])
def test_a_keys_bucket_holds_the_keys_in_whole_pages_with_little_to_spare(page) -> None:
    previous = 0
    for n in [*range(1, 5000, 7), 65_536, 65_537, 262_150]:
        b = key_bucket(n, page)
        assert b >= n and b % page == 0 and b % MIN_KEY_BUCKET == 0
        assert b >= previous  # more keys never get a smaller bucket
        previous = b
        assert b - n < max(page, MIN_KEY_BUCKET, n // KEY_BUCKETS_PER_DOUBLING + 1)


def test_consecutive_steps_share_a_bucket() -> None:
    """A context growing by a few tokens a step keeps its shape for many steps."""
    buckets = {key_bucket(4096 + BLOCK + step * 4, 64) for step in range(100)}
    assert len(buckets) <= 2


def build(device: str) -> tuple[BlockDrafter, torch.Tensor, DrafterCache]:
    """The tiny drafter with two sequences' contexts (19 and 37 tokens) written in its cache of
    PAGES_PER_SEQ pages each (sequence b's pages after b's), plus scratch pages after them:
    (drafter, block tables [2, PAGES_PER_SEQ], cache)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    target = build_tiny_model(seed=0, device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(5)
    drafter, config = build_tiny_block_drafter(target, gen)
    cache = allocate_drafter_cache(
        drafter.cache_spec(), num_blocks=2 * PAGES_PER_SEQ + 8, block_size=PAGE, device=device
    )
    tables = torch.arange(2 * PAGES_PER_SEQ, device=device).view(2, PAGES_PER_SEQ)
    lengths = (19, 37)
    width = config.num_taps * 64
    tapped = torch.randn(sum(lengths), width, generator=gen).to(device, dtype)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device)
    seq_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]).to(device)
    with torch.inference_mode():
        drafter.write_context(tapped, positions, cache, block_tables=tables, seq_ids=seq_ids)
    return drafter.eval(), tables, cache


def test_a_proposal_over_a_keys_bucket_drafts_what_the_exact_context_does() -> None:
    drafter, tables, cache = build("cpu")
    anchors, starts = torch.tensor([3, 7]), torch.tensor([19, 37])
    exact = 37 + BLOCK
    outs = []
    for num_keys in (exact, key_bucket(exact, PAGE)):
        with torch.inference_mode():
            width = num_keys // PAGE + (num_keys % PAGE > 0)
            draft = drafter.propose(
                anchors, starts, cache, block_tables=tables[:, :width], num_keys=num_keys
            )
            outs.append((draft.logits, drafter.draft_tokens(draft, anchors).tokens))
    assert key_bucket(exact, PAGE) > exact
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    # Each bucket draft is a best pick of the exact context's logits (equal but for ties within
    # rounding: on the CPU the two key counts are matmuls of different shapes; the GPU test below
    # holds the tokens to the bits).
    exact_logits, bucket_tokens = outs[0][0], outs[1][1]
    picked = exact_logits.gather(-1, bucket_tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(picked, exact_logits.amax(-1), atol=1e-5, rtol=1e-5)


@contextlib.contextmanager
def gathered(drafter: BlockDrafter, is_gathered: bool = True) -> Iterator[None]:
    """The drafter's proposals gather and mask their keys (keys-bucket shapes), whatever the
    pages."""
    drafter.use_paged_attention = not is_gathered
    try:
        yield
    finally:
        drafter.use_paged_attention = True


@pytest.mark.gpu
@pytest.mark.parametrize("is_gathered", [False, True])
def test_graphed_proposals_replay_what_eager_ones_give(is_gathered) -> None:
    """Two real rows in a bucket of four (two padding rows on their own scratch pages), at two
    keys buckets, tokens bit for bit as eager: a paged attention's one graph per rows bucket
    (captured up front) serves both, a gathered one captures a graph per keys bucket on its
    first use."""
    from sparkinfer.kernels.linear import batch_invariant
    from sparkinfer.scheduler.graphs.block_drafter import BlockDrafterGraphs

    drafter, tables, cache = build("cuda")
    scratch = 2 * PAGES_PER_SEQ  # pages 80 .. 87: two per padding row
    max_keys = PAGES_PER_SEQ * PAGE
    pad = [[scratch + 2 * r] * PAGES_PER_SEQ for r in range(4)]
    torch.cuda.synchronize()  # the contexts, written on the default stream
    stream = torch.cuda.Stream()
    with (
        torch.inference_mode(), batch_invariant("decode"), torch.cuda.stream(stream),
        gathered(drafter, is_gathered),
    ):  # fmt: skip
        graphs = BlockDrafterGraphs(
            drafter, cache, row_sizes=(1, 4), max_keys=max_keys,
            pad_tables=torch.tensor(pad, dtype=torch.int64), stream=stream,
        )  # fmt: skip
        assert graphs.is_paged is not is_gathered
        if graphs.is_paged:
            graphs.capture_all()
            assert graphs.num_graphs() == 2
        for anchors, starts in (([3, 7], [19, 37]), ([11, 5], [19, 37])):
            for num_keys in (256, 512):
                width = num_keys // PAGE
                got = graphs.run(anchors, starts, tables[:, :width].tolist(), num_keys)
                assert got is not None
                got = got.clone()
                a = torch.tensor(anchors, device="cuda")
                draft = drafter.propose(
                    a, torch.tensor(starts, device="cuda"), cache,
                    block_tables=tables[:, :width], num_keys=num_keys,
                )  # fmt: skip
                want = drafter.draft_tokens(draft, a).tokens
                assert torch.equal(got, want), (num_keys, got, want)
        assert graphs.num_graphs() == 2  # paged: rows 1 and 4; gathered: rows 4 at two keys
        assert graphs.run([1] * 5, [0] * 5, [[0] * 16] * 5, 256) is None  # rows past the buckets
        assert graphs.run([1], [0], [[0] * 41], 41 * PAGE) is None  # keys past max_keys


@pytest.mark.gpu
def test_a_paged_proposal_is_the_gathered_one_within_rounding() -> None:
    """bf16, under the decode numerics: the paged attention's logits within bf16 rounding of
    the gathered SDPA's."""
    from sparkinfer.kernels.linear import batch_invariant

    drafter, tables, cache = build("cuda")
    assert drafter.reads_paged(cache)
    anchors, starts = torch.tensor([3, 7], device="cuda"), torch.tensor([19, 37], device="cuda")
    out = []
    for is_gathered in (False, True):
        with torch.inference_mode(), batch_invariant("decode"), gathered(drafter, is_gathered):
            out.append(drafter.propose(anchors, starts, cache, block_tables=tables, num_keys=256))
    torch.testing.assert_close(out[0].hidden, out[1].hidden, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(out[0].logits, out[1].logits, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 3, 8, 13])
def test_graphed_context_writes_write_what_eager_ones_do(num_rows) -> None:
    """A step's rows (a bucket's padding rows after them) through the context graphs: each
    written cache row bit for bit as the eager write, no row touched but theirs and the dump
    row."""
    from sparkinfer.kernels.linear import batch_invariant
    from sparkinfer.scheduler.graphs.drafter_context import (
        DrafterContextGraphs,
        context_row_sizes,
    )

    assert context_row_sizes(16) == (1, 2, 4, 8, 16)
    assert context_row_sizes(13) == (1, 2, 4, 8, 16)
    drafter, tables, cache = build("cuda")
    dump_row = (2 * PAGES_PER_SEQ + 7) * PAGE  # the last scratch page
    gen = torch.Generator().manual_seed(num_rows)
    width = drafter.config.num_taps * 64
    tapped = torch.randn(num_rows, width, generator=gen).to("cuda", torch.bfloat16)
    positions = list(range(40, 40 + num_rows))
    at = np.asarray(positions)
    rows = tables[1].cpu().numpy()[at // PAGE] * PAGE + at % PAGE
    torch.cuda.synchronize()  # the contexts, written on the default stream
    stream = torch.cuda.Stream()
    want = DrafterCache(cache.k.clone(), cache.v.clone(), cache.block_size)
    with torch.inference_mode(), batch_invariant("decode"), torch.cuda.stream(stream):
        graphs = DrafterContextGraphs(drafter, cache, max_rows=16, dump_row=dump_row, stream=stream)
        before = DrafterCache(cache.k.clone(), cache.v.clone(), cache.block_size)
        assert graphs.run(tapped, positions, rows)
        drafter.write_context_rows(
            tapped, torch.tensor(positions, device="cuda"), want,
            rows=torch.tensor(rows, device="cuda"),
        )  # fmt: skip
        assert not graphs.run(tapped[:1].expand(17, -1), list(range(17)), np.zeros(17))
    torch.cuda.synchronize()
    dump = slice(dump_row, dump_row + 1)
    written = torch.from_numpy(rows).to("cuda")
    for got, expected, old in ((cache.k, want.k, before.k), (cache.v, want.v, before.v)):
        assert torch.equal(got[:, written], expected[:, written])
        untouched = torch.ones(got.shape[1], dtype=torch.bool, device="cuda")
        untouched[written] = False
        untouched[dump] = False
        assert torch.equal(got[:, untouched], old[:, untouched])
