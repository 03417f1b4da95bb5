"""The block drafter against a plain-torch reference of the published computation, per layout:
the block forward (context + block, non-causal), the KV cache across a rejection, the heads."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.model.drafters.cache import allocate_drafter_cache, cache_rows
from sparkinfer.model.drafters.config import DFLASH2, DrafterConfig, parse_drafter_config
from sparkinfer.model.drafters.dflash import BlockDrafter, SharedTargetModules, block_visibility
from sparkinfer.model.layers import select_ops
from sparkinfer.model.layers.embedding import Embedding, LMHead

sys.path.insert(0, str(Path(__file__).parent))
from drafter_checkpoints import PUBLISHED, random_tensors, shrink

HIDDEN, VOCAB, TARGET_LAYERS = 64, 320, 8
TOL = {"atol": 1e-4, "rtol": 1e-4}


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, D] at positions [T], rotate_half over the whole head."""
    d = x.shape[-1]
    angle = pos[:, None].float() / theta ** (torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


def conv(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, group: int) -> torch.Tensor:
    """DFlash2's in-block convolution, row by row: x [S, h], dyn [S, K, G], base [K, h]."""
    y = torch.zeros_like(x)
    for j in range(x.shape[0]):
        for o in range(base.shape[0]):
            if j - o >= 0:
                y[j] += (base[o] + dyn[j, o].repeat_interleave(group)) * x[j - o]
    return y


def block_forward_ref(w, c: DrafterConfig, embed, head, tapped, anchor: int):
    """One sequence from scratch: context = tapped [P, taps * h] at positions 0..P-1, block =
    [anchor, mask...] at P.. -> (rows [n, h], logits [n, V]). K/V of every layer come from
    [context | block], queries from the block, which sees itself whole."""
    p_len, s, d, eps = tapped.shape[0], c.block_size, c.head_dim, c.rms_norm_eps
    heads, kv_heads, g = c.num_attention_heads, c.num_key_value_heads, c.conv_group_size
    ctx = rms(tapped @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    x = embed[[anchor] + [c.mask_token_id] * (s - 1)] * c.input_embedding_scale
    q_pos, k_pos = p_len + torch.arange(s), torch.arange(p_len + s)
    for n in range(c.num_hidden_layers):

        def lin(x, name, n=n):
            return x @ w[f"layers.{n}.{name}.weight"].T

        def norm(x, name, n=n):
            return rms(x, w[f"layers.{n}.{name}.weight"], eps)

        def conv_in(x, name, n=n):  # DFlash2: (x convolved, the kernel for conv_out)
            dyn = lin(x, f"{name}.kernel_projection").view(s, 2, c.conv_kernel_size, -1)
            return conv(x, dyn[:, 0], w[f"layers.{n}.{name}.base_kernel"][0], g), dyn[:, 1]

        def conv_out(x, name, dyn, n=n):
            return conv(x, dyn, w[f"layers.{n}.{name}.base_kernel"][1], g)

        is_conv = c.layout == DFLASH2
        h = norm(x, "input_layernorm")
        if is_conv:
            h, dyn = conv_in(h, "attention_conv")
        q = norm(lin(h, "self_attn.q_proj").view(s, heads, d), "self_attn.q_norm")
        q = rope(q, q_pos, c.rope_theta)
        kv_in = torch.cat([ctx, h])
        k = norm(lin(kv_in, "self_attn.k_proj").view(-1, kv_heads, d), "self_attn.k_norm")
        k = rope(k, k_pos, c.rope_theta)
        v = lin(kv_in, "self_attn.v_proj").view(-1, kv_heads, d)
        out = torch.empty(s, heads, d)
        for head_idx in range(heads):
            kv = head_idx // (heads // kv_heads)
            scores = q[:, head_idx] @ k[:, kv].T / math.sqrt(d)  # [S, P + S]
            window = c.sliding_windows[n]
            if window is not None:
                scores[(q_pos[:, None] - k_pos).abs() >= window] = float("-inf")
            if c.is_causal:
                scores[k_pos > q_pos[:, None]] = float("-inf")
            out[:, head_idx] = scores.softmax(-1) @ v[:, kv]
        a = lin(out.reshape(s, -1), "self_attn.o_proj")
        x = x + (conv_out(a, "attention_conv", dyn) if is_conv else a)
        h = norm(x, "post_attention_layernorm")
        if is_conv:
            h, dyn = conv_in(h, "mlp_conv")
        m = lin(F.silu(lin(h, "mlp.gate_proj")) * lin(h, "mlp.up_proj"), "mlp.down_proj")
        x = x + (conv_out(m, "mlp_conv", dyn) if is_conv else m)
    x = rms(x, w["norm.weight"], eps)
    rows = x if c.is_shifted else x[1:]
    return rows, rows @ head.T


def build(name: str, *, seed: int = 0, device: str = "cpu", **changes):
    """(drafter with random weights in fp32, its weights by checkpoint name, embed, head), the
    last three on the CPU."""
    data = shrink(PUBLISHED[name], hidden=HIDDEN, vocab=VOCAB, num_layers=TARGET_LAYERS)
    config = dataclasses.replace(parse_drafter_config(data), **changes)
    gen = torch.Generator().manual_seed(seed + 100)
    dims = {"device": torch.device(device), "dtype": torch.float32}
    ops = select_ops(use_triton=device == "cuda")
    embed, head = (
        Embedding(VOCAB, HIDDEN, **dims),
        LMHead(VOCAB, HIDDEN, num_real_tokens=VOCAB, ops=ops, **dims),
    )
    with torch.no_grad():
        embed.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen))
        head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen) * 0.2)
    drafter = BlockDrafter(config, SharedTargetModules(embed, head), ops=ops, **dims)
    weights = random_tensors(data, seed)
    params = dict(drafter.named_parameters())
    with torch.no_grad():
        for k, t in weights.items():
            params[k].copy_(t)
    return drafter, weights, embed.weight.detach().cpu(), head.weight.detach().cpu()


LAYOUTS = list(PUBLISHED)


def _contexts(drafter: BlockDrafter, lengths, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    width = drafter.config.num_taps * HIDDEN
    return [torch.randn(n, width, generator=gen) for n in lengths]


def paged(drafter, num_seqs: int, *, device: str = "cpu", seed: int = 0, page: int = 4):
    """A drafter cache of `page`-position pages (4: too small for the paged attention, so the
    proposal gathers its keys), and each sequence's 12 pages in shuffled order (page 0 never
    used, so a stray write shows): (cache, block_tables [num_seqs, 12])."""
    order = torch.randperm(num_seqs * 12 + 1, generator=torch.Generator().manual_seed(seed))
    pages = order[order != 0].view(num_seqs, 12)
    cache = allocate_drafter_cache(
        drafter.cache_spec(), num_blocks=num_seqs * 12 + 1, block_size=page, device=device
    )
    return cache, pages.to(device)


def _propose(drafter, cache, tables, contexts, anchors):
    """Write every context (packed, in one call) and propose one block per sequence."""
    dev = drafter.fc.weight.device
    drafter.write_context(
        torch.cat(contexts).to(dev),
        torch.cat([torch.arange(len(t)) for t in contexts]).to(dev),
        cache,
        block_tables=tables,
        seq_ids=torch.cat([torch.full((len(t),), i) for i, t in enumerate(contexts)]).to(dev),
    )
    positions = torch.tensor([len(t) for t in contexts], device=dev)
    num_keys = int(positions.max()) + drafter.config.block_size
    anchors = torch.tensor(anchors, device=dev)
    return drafter.propose(anchors, positions, cache, block_tables=tables, num_keys=num_keys)


@pytest.mark.parametrize("name", LAYOUTS)
def test_block_forward_equals_the_reference(name) -> None:
    """Two sequences in one call (contexts of 7 and 11 tokens, past the window of 5), in
    shuffled cache rows: each equals the reference computed alone from scratch."""
    drafter, w, embed, head = build(name)
    cache, tables = paged(drafter, 2)
    contexts, anchors = _contexts(drafter, [7, 11]), [5, 17]
    draft = _propose(drafter, cache, tables, contexts, anchors)
    n = drafter.config.num_drafts
    assert draft.logits.shape == (2, n, VOCAB) and draft.hidden.shape == (2, n, HIDDEN)
    for b in range(2):
        rows, logits = block_forward_ref(w, drafter.config, embed, head, contexts[b], anchors[b])
        torch.testing.assert_close(draft.hidden[b], rows, **TOL)
        torch.testing.assert_close(draft.logits[b], logits, **TOL)


@contextlib.contextmanager
def gathered(drafter: BlockDrafter) -> Iterator[None]:
    """The drafter's proposals gather their keys and mask them, whatever the pages."""
    drafter.use_paged_attention = False
    try:
        yield
    finally:
        drafter.use_paged_attention = True


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_paged_block_forward_equals_the_reference(name) -> None:
    """Pages of 16 positions: every drafter attends over the pages (the decode attention, heads
    packed per KV head, where its rows see the whole context and block; the block attention
    under a window); each sequence equals the reference computed alone, and the paged proposal
    the gathered one."""
    drafter, w, embed, head = build(name)
    cache, tables = paged(drafter, 2, page=16)
    assert drafter.reads_paged(cache)
    contexts, anchors = _contexts(drafter, [7, 11]), [5, 17]
    draft = _propose(drafter, cache, tables, contexts, anchors)
    for b in range(2):
        rows, logits = block_forward_ref(w, drafter.config, embed, head, contexts[b], anchors[b])
        torch.testing.assert_close(draft.hidden[b], rows, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(draft.logits[b], logits, atol=1e-4, rtol=1e-4)
    with gathered(drafter):
        assert not drafter.reads_paged(cache)
        again = _propose(drafter, cache, tables, contexts, anchors)
    torch.testing.assert_close(draft.logits, again.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("page", [4, 16])
def test_cuda_paged_or_gathered_block_forward_matches_the_reference(name, page) -> None:
    """Either attention on the GPU (pages of 16: the decode kernel where the drafter's rows see
    the whole context and block, else the block kernel), at two contexts past one split and
    the window: within 2e-2 of the reference. The kernels' fp32 dots are IEEE: DFlash2's
    in-block convolutions (a product of the input and a kernel predicted from it, in every
    sublayer) magnify an error of the attention about twentyfold with these random weights,
    and tf32 dots put 0.13 into its logits."""
    drafter, w, embed, head = build(name, device="cuda")
    cache, tables = paged(drafter, 2, device="cuda", page=page)
    lengths = (7, 11) if page == 4 else (100, 150)
    contexts, anchors = _contexts(drafter, lengths), [5, 17]
    draft = _propose(drafter, cache, tables, contexts, anchors)
    for b in range(2):
        _, logits = block_forward_ref(w, drafter.config, embed, head, contexts[b], anchors[b])
        torch.testing.assert_close(draft.logits[b].cpu(), logits, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", LAYOUTS)
def test_cuda_block_forward_matches_the_reference(name) -> None:
    """The same on the GPU with the kernels' linear (cuBLAS for these fp32 shapes, no table
    entry): within 2e-2 of the reference."""
    drafter, w, embed, head = build(name, device="cuda")
    cache, tables = paged(drafter, 2, device="cuda")
    contexts, anchors = _contexts(drafter, [7, 11]), [5, 17]
    draft = _propose(drafter, cache, tables, contexts, anchors)
    for b in range(2):
        _, logits = block_forward_ref(w, drafter.config, embed, head, contexts[b], anchors[b])
        torch.testing.assert_close(draft.logits[b].cpu(), logits, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_a_cuda_graph_of_the_proposal_replays_as_eager() -> None:
    """The block forward has fixed shapes and no host sync: captured once, replayed with new
    anchors it gives what an eager call gives."""
    drafter, *_ = build("RadixArk/Qwen3.8-27B-DSpark", device="cuda")
    cache, tables = paged(drafter, 2, device="cuda")
    _propose(drafter, cache, tables, _contexts(drafter, [7, 11]), [5, 17])  # the contexts
    anchors = torch.tensor([5, 17], device="cuda")
    positions = torch.tensor([7, 11], device="cuda")
    num_keys = 11 + drafter.config.block_size

    def run():
        return drafter.propose(anchors, positions, cache, block_tables=tables, num_keys=num_keys)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up: kernels built outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    anchors.copy_(torch.tensor([40, 41], device="cuda"))
    graph.replay()
    torch.testing.assert_close(captured.logits, run().logits)


def test_block_rows_see_later_rows() -> None:
    """Non-causal within the block: every row attends to all rows of its own block and to the
    context before its anchor, nothing after the block; a causal drafter gives other logits."""
    vis = block_visibility(torch.tensor([3]), 4, 9, window=None, is_causal=False)[0, 0]
    assert vis.tolist() == [[True] * 7 + [False] * 2] * 4
    causal = block_visibility(torch.tensor([3]), 4, 9, window=None, is_causal=True)[0, 0]
    assert causal[0].tolist() == [True] * 4 + [False] * 5
    windowed = block_visibility(torch.tensor([3]), 4, 9, window=2, is_causal=False)[0, 0]
    assert windowed[1].tolist() == [False] * 3 + [True] * 3 + [False] * 3
    outputs = []
    for is_causal in (False, True):
        drafter, *_ = build("z-lab/Qwen3.5-27B-DFlash", is_causal=is_causal)
        cache, tables = paged(drafter, 1)
        outputs.append(_propose(drafter, cache, tables, _contexts(drafter, [6]), [4]).logits)
    assert not torch.allclose(outputs[0][:, :-1], outputs[1][:, :-1], atol=1e-3)


@pytest.mark.parametrize("name", ["z-lab/Qwen3.6-27B-DFlash", "RadixArk/Qwen3.8-27B-DSpark"])
def test_kv_after_a_rejection_equals_recomputing_from_scratch(name) -> None:
    """Propose at 9 (scratch K/V at 9..), accept 2 drafts: write the 3 verified tokens'
    context over the scratch and propose at 12. Same as a fresh cache (other pages) given all
    12 at once."""
    drafter, *_ = build(name)
    full = _contexts(drafter, [12])[0]
    kept, tables = paged(drafter, 1)
    _propose(drafter, kept, tables, [full[:9]], [8])
    one = torch.zeros(3, dtype=torch.int64)
    drafter.write_context(full[9:], torch.arange(9, 12), kept, block_tables=tables, seq_ids=one)
    num_keys = 12 + drafter.config.block_size
    after = drafter.propose(
        torch.tensor([3]), torch.tensor([12]), kept, block_tables=tables, num_keys=num_keys
    )
    fresh, fresh_tables = paged(drafter, 1, seed=5)
    want = _propose(drafter, fresh, fresh_tables, [full], [3])
    torch.testing.assert_close(after.logits, want.logits, **TOL)
    positions = torch.arange(12)[None]
    kept_rows = cache_rows(tables, positions, 4)[0]
    fresh_rows = cache_rows(fresh_tables, positions, 4)[0]
    torch.testing.assert_close(kept.k[:, kept_rows], fresh.k[:, fresh_rows], **TOL)


def test_dflash_picks_each_rows_argmax() -> None:
    drafter, *_ = build("z-lab/Qwen3.5-27B-DFlash")
    cache, tables = paged(drafter, 1)
    draft = _propose(drafter, cache, tables, _contexts(drafter, [5]), [9])
    chosen = drafter.draft_tokens(draft, torch.tensor([9]))
    assert torch.equal(chosen.tokens, draft.logits.argmax(-1))
    assert drafter.confidence_logits(draft, chosen.tokens, torch.tensor([9])) is None


def test_dspark_chains_the_markov_head_and_scores_confidence() -> None:
    """Row j's pick is argmax(logits_j + w2 @ w1[previous pick]), the anchor before row 0; the
    confidence logit reads [hidden_j | w1[previous]]."""
    drafter, w, *_ = build("RadixArk/Qwen3.8-27B-DSpark")
    cache, tables = paged(drafter, 2)
    anchors = torch.tensor([9, 40])
    draft = _propose(drafter, cache, tables, _contexts(drafter, [5, 8]), anchors.tolist())
    chosen = drafter.draft_tokens(draft, anchors)
    w1, w2 = w["markov_head.markov_w1.weight"], w["markov_head.markov_w2.weight"]
    for b in range(2):
        prev, prevs = int(anchors[b]), []
        for j in range(drafter.config.num_drafts):
            prevs.append(prev)
            prev = int((draft.logits[b, j] + w2 @ w1[prev]).argmax())
            assert int(chosen.tokens[b, j]) == prev
        features = torch.cat([draft.hidden[b], w1[prevs]], -1)
        want = features @ w["confidence_head.proj.weight"][0] + w["confidence_head.proj.bias"]
        got = drafter.confidence_logits(draft, chosen.tokens, anchors)
        assert got is not None
        torch.testing.assert_close(got[b], want, **TOL)


def test_dflash2_selects_a_path_through_the_top_candidates() -> None:
    """Row j scores its top-k candidates c after the previous pick p as
    logit(c) + sum_r pred[p, r] * (W h_j)[r] * succ[c, r] and takes the best."""
    drafter, w, *_ = build("Qwen3.8-27B-DFlash2")
    cache, tables = paged(drafter, 1)
    draft = _propose(drafter, cache, tables, _contexts(drafter, [6]), [9])
    chosen = drafter.draft_tokens(draft, torch.tensor([9]))
    pred, succ = (
        w["candidate_selector.predecessor_codebook"],
        w["candidate_selector.successor_codebook"],
    )
    proj = draft.hidden[0] @ w["candidate_selector.hidden_projection.weight"].T
    prev = 9
    for j in range(drafter.config.num_drafts):
        top = draft.logits[0, j].topk(drafter.config.selector_top_k)
        scores = top.values + (succ[top.indices] * (pred[prev] * proj[j])).sum(-1)
        prev = int(top.indices[scores.argmax()])
        assert int(chosen.tokens[0, j]) == prev
