"""Gated delta rule: references against transformers, fast ops against references."""

import dataclasses
import inspect
import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from sparkinfer.kernels.gated_delta_rule import (
    chunk,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_ref,
    gdn_gating,
    gdn_gating_ref,
)
from sparkinfer.kernels.gated_delta_rule._chunk_index import (
    chunk_index_tables,
    chunk_index_tables_ref,
)
from sparkinfer.kernels.gated_delta_rule.ref import l2norm_ref
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.rms_norm import gated_rms_norm
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

H, HV, K, V = 2, 4, 16, 16


def make_inputs(T: int, *, seed: int, dtype: torch.dtype = torch.float32, num_slots: int = 4):
    """Random q, k, v [T, *, *], gates a, b [T, HV], A_log, dt_bias [HV] and a state pool
    [num_slots, HV, V, K] (each head's S stored transposed)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(T, H, K).to(dtype),
        "k": randn(T, H, K).to(dtype),
        "v": randn(T, HV, V).to(dtype),
        "a": randn(T, HV).to(dtype),
        "b": randn(T, HV).to(dtype),
        "A_log": torch.rand(HV, generator=gen) * 2.0,
        "dt_bias": randn(HV),
        "state": randn(num_slots, HV, V, K) * 0.1,
    }


def varlen(lengths: list[int], device: str = "cpu") -> torch.Tensor:
    """cu_seqlens [B + 1] int32 for the given sequence lengths."""
    cu = F.pad(torch.tensor(lengths, dtype=torch.int32).cumsum(0), (1, 0)).to(torch.int32)
    return cu.to(device)


def run_chunk(fn, x: dict, lengths: list[int], slots: list[int], has_init: list[bool], **kw):
    """Gates from x, then fn (fast or reference) on a copy of the pool: returns (o, state)."""
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    state = x["state"].clone()
    device = state.device
    o = fn(
        x["q"], x["k"], x["v"], g, beta.to(x["v"].dtype), state,
        cu_seqlens=varlen(lengths, device),
        state_slots=torch.tensor(slots, device=device),
        has_initial_state=torch.tensor(has_init, device=device),
        **kw,
    )  # fmt: skip
    return o, state


def test_ref_matches_transformers_chunk_and_recurrent():
    x = make_inputs(70, seed=0)
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    hf_g = -x["A_log"].float().exp() * F.softplus(x["a"].float() + x["dt_bias"])
    torch.testing.assert_close(g, hf_g)
    torch.testing.assert_close(beta, x["b"].sigmoid())

    init = x["state"][1].transpose(-1, -2).clone()  # transformers' S is [K, V]
    state = x["state"].clone()
    o = chunk_gated_delta_rule_ref(
        x["q"], x["k"], x["v"], g, beta, state,
        cu_seqlens=varlen([70]),
        state_slots=torch.tensor([1]),
        has_initial_state=torch.tensor([True]),
    )  # fmt: skip
    args = (x["q"][None], x["k"][None], x["v"][None], g[None], beta[None])
    for fn in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        hf_o, hf_state = fn(
            *args, initial_state=init[None], output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        torch.testing.assert_close(o, hf_o[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(state[1].mT, hf_state[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state[0], x["state"][0])


def test_ref_recurrent_matches_transformers_decode():
    x = make_inputs(3, seed=1)
    slots = torch.tensor([2, -1, 0])
    state = x["state"].clone()
    o = fused_recurrent_gated_delta_rule_ref(
        x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], state, state_slots=slots
    )
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    for i, slot in [(0, 2), (2, 0)]:
        hf_o, hf_state = hf.torch_recurrent_gated_delta_rule(
            x["q"][None, i : i + 1], x["k"][None, i : i + 1], x["v"][None, i : i + 1],
            g[None, i : i + 1], beta[None, i : i + 1],
            initial_state=x["state"][slot].mT[None], output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        torch.testing.assert_close(o[i], hf_o[0, 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state[slot].mT, hf_state[0], atol=1e-5, rtol=1e-5)
    assert o[1].abs().max() == 0
    torch.testing.assert_close(state[1], x["state"][1])
    torch.testing.assert_close(state[3], x["state"][3])


@pytest.mark.parametrize(
    ("fast", "ref"),
    [
        (chunk_gated_delta_rule, chunk_gated_delta_rule_ref),
        (fused_recurrent_gated_delta_rule, fused_recurrent_gated_delta_rule_ref),
        (gdn_gating, gdn_gating_ref),
    ],
)
def test_fast_op_signature_matches_ref(fast, ref):
    assert inspect.signature(fast) == inspect.signature(ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_varlen(dtype, assert_close):
    # Lengths on both sides of the chunk (64) and sub-block (16) boundaries, ragged, with a
    # padding row (-1), with and without initial state.
    lengths = [1, 63, 64, 65, 17, 3]
    slots = [3, 0, -1, 5, 1, 2]
    has_init = [True, False, True, True, False, True]
    x = make_inputs(sum(lengths), seed=10, dtype=dtype, num_slots=7)
    o, state = run_chunk(chunk_gated_delta_rule, x, lengths, slots, has_init)
    o_ref, state_ref = run_chunk(chunk_gated_delta_rule_ref, x, lengths, slots, has_init)
    assert o.dtype == dtype
    assert_close(o, o_ref)
    assert_close(state, state_ref, dtype)
    pad = slice(sum(lengths[:2]), sum(lengths[:3]))
    assert o[pad].abs().max() == 0


def test_chunk_strided_inputs_and_options(assert_close):
    # q, k, v as views into one packed [T, C] projection, as the model produces them.
    lengths = [40, 27]
    x = make_inputs(sum(lengths), seed=11)
    packed = torch.cat([x["q"].flatten(1), x["k"].flatten(1), x["v"].flatten(1)], dim=1)
    x["q"] = packed[:, : H * K].view(-1, H, K)
    x["k"] = packed[:, H * K : 2 * H * K].view(-1, H, K)
    x["v"] = packed[:, 2 * H * K :].view(-1, HV, V)
    kw = {"scale": 0.3, "use_qk_l2norm": False}
    x["q"], x["k"] = x["q"] * 0.2, x["k"] * 0.2
    o, state = run_chunk(chunk_gated_delta_rule, x, lengths, [0, 1], [True, False], **kw)
    o_ref, state_ref = run_chunk(
        chunk_gated_delta_rule_ref, x, lengths, [0, 1], [True, False], **kw
    )
    assert_close(o, o_ref)
    assert_close(state, state_ref)


@pytest.mark.any_device
def test_chunk_deterministic_and_batch_invariant(assert_same_bits, assert_same_bits_on_gpu):
    """A repeated launch gives the same bits; the last sequence alone gives its output and state
    in the batch, bit for bit on the GPU (within tolerance under the interpreter, whose dots are
    numpy's, rounded per shape)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lengths = [70, 5, 66]
    x = make_inputs(sum(lengths), seed=12, dtype=torch.bfloat16, num_slots=3)
    x = {name: t.to(device) for name, t in x.items()}
    o1, s1 = run_chunk(chunk_gated_delta_rule, x, lengths, [0, 1, 2], [True, False, True])
    o2, s2 = run_chunk(chunk_gated_delta_rule, x, lengths, [0, 1, 2], [True, False, True])
    assert_same_bits(o1, o2)
    assert_same_bits(s1, s2)
    alone = {name: t[75:] if t.shape[0] == sum(lengths) else t for name, t in x.items()}
    o3, s3 = run_chunk(chunk_gated_delta_rule, alone, [66], [2], [True])
    assert_same_bits_on_gpu(o3, o1[75:])
    assert_same_bits_on_gpu(s3[2], s1[2])


@pytest.mark.any_device
@pytest.mark.parametrize("seed", range(4))
def test_chunk_index_tables_match_ref(seed, assert_same_bits):
    """Random varlen batches (empty sequences, 1 to 70 of them, lengths on and off the chunk and
    block edges, more chunk rows than one program holds): the kernel's tables are the ref's."""
    gen = torch.Generator().manual_seed(seed)
    num_seqs = int(torch.randint(1, 71, (1,), generator=gen))
    lens = torch.randint(0, 300, (num_seqs,), generator=gen)
    lens[torch.rand(num_seqs, generator=gen) < 0.2] = 0
    lens[torch.rand(num_seqs, generator=gen) < 0.2] = 64 * int(
        torch.randint(1, 5, (1,), generator=gen)
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cu_seqlens = F.pad(torch.cumsum(lens, 0), (1, 0)).to(torch.int32).to(device)
    num_tokens = int(cu_seqlens[-1])
    for chunk_len, block_len in ((64, 64), (64, 128), (64, 512), (16, 32)):
        got = chunk_index_tables(cu_seqlens, num_tokens, chunk_len, block_len)
        want = chunk_index_tables_ref(cu_seqlens, num_tokens, chunk_len, block_len)
        for g, w in zip(got, want, strict=True):
            assert_same_bits(g, w)


def test_chunk_index_cache_builds_tables_once_per_cu_seqlens(monkeypatch, assert_same_bits):
    """Calls sharing an index_cache over one cu_seqlens tensor (the layers of a step) build the
    chunk tables once and give the bits of calls without it; another cu_seqlens rebuilds them."""
    built = []

    def counted_chunk_table(*args):
        built.append(args)
        return chunk_index_tables(*args)

    monkeypatch.setattr(chunk, "chunk_index_tables", counted_chunk_table)
    lengths, slots, has_init = [70, 5, 9], [0, 1, 2], [True, False, True]
    x = make_inputs(sum(lengths), seed=13, dtype=torch.bfloat16, num_slots=3)
    index_cache: dict[str, tuple[torch.Tensor, ...]] = {}
    cu_seqlens = varlen(lengths)

    def call(cu: torch.Tensor, cache: dict | None) -> tuple[torch.Tensor, torch.Tensor]:
        g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
        state = x["state"].clone()
        o = chunk_gated_delta_rule(
            x["q"], x["k"], x["v"], g, beta.to(x["v"].dtype), state, cu_seqlens=cu,
            state_slots=torch.tensor(slots), has_initial_state=torch.tensor(has_init),
            index_cache=cache,
        )  # fmt: skip
        return o, state

    expected = call(cu_seqlens, None)
    for _ in range(2):
        o, state = call(cu_seqlens, index_cache)
        assert_same_bits(o, expected[0])
        assert_same_bits(state, expected[1])
    assert len(built) == 2 and len(index_cache) == 1  # one build without the cache, one with it
    o, state = call(varlen(lengths), index_cache)  # an equal but distinct tensor: rebuilt
    assert len(built) == 3
    assert_same_bits(o, expected[0])
    assert_same_bits(state, expected[1])


@pytest.mark.any_device
def test_chunk_cut_at_output_blocks_equals_one_call(assert_same_bits_on_gpu):
    """A prompt run in pieces that end on output-block multiples (64 * out_chunks), each piece
    starting from the previous one's state, gives the bits of one call on the GPU: the contract
    that lets a deterministic scheduler cut prompts wherever its budget ends on such a multiple
    (within tolerance under the interpreter, whose dots are numpy's, rounded per shape)."""
    block = chunk.BT * chunk.LAUNCH.out_chunks
    total = 2 * block + 22
    x = make_inputs(total, seed=21, dtype=torch.bfloat16, num_slots=1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = {name: t.to(device) for name, t in x.items()}
    x["state"].zero_()
    whole, whole_state = run_chunk(chunk_gated_delta_rule, x, [total], [0], [False])
    # The interpreter, slow, runs only the three pieces (a cut at each multiple).
    cut_lists = ([block], [block, 2 * block]) if device == "cuda" else ([block, 2 * block],)
    for cuts in cut_lists:
        outs, state = [], x["state"]
        for start, end in itertools.pairwise([0, *cuts, total]):
            piece = {n: t[start:end] if t.shape[0] == total else t for n, t in x.items()}
            piece["state"] = state
            o, state = run_chunk(chunk_gated_delta_rule, piece, [end - start], [0], [start > 0])
            outs.append(o)
        assert_same_bits_on_gpu(torch.cat(outs), whole)
        assert_same_bits_on_gpu(state, whole_state)


def wy_ref(x: dict, g: torch.Tensor, beta: torch.Tensor, lengths: list[int], scale: float):
    """Per-chunk (64) WY form in fp32 with torch.linalg: (q̂, k̂, g_cum, w, u) as in ChunkWY."""
    num_heads, num_v_heads = x["q"].shape[1], x["v"].shape[1]
    q_hat, k_hat = l2norm_ref(x["q"]) * scale, l2norm_ref(x["k"])
    g_cum, w, u = torch.zeros_like(g), torch.zeros(*g.shape, K), torch.zeros(x["v"].shape)
    bounds = varlen(lengths).tolist()
    for bos, eos in itertools.pairwise(bounds):
        for t0 in range(bos, eos, 64):
            rows = slice(t0, min(t0 + 64, eos))
            g_cum[rows] = g[rows].cumsum(0)
            for hv in range(num_v_heads):
                kc = k_hat[rows, hv // (num_v_heads // num_heads)]
                gc, bc = g_cum[rows, hv], beta[rows, hv].float()
                a = (bc[:, None] * (kc @ kc.T) * (gc[:, None] - gc[None, :]).exp()).tril(-1)
                eye = torch.eye(a.shape[0])
                t = torch.linalg.solve_triangular(eye + a, eye, upper=False)
                w[rows, hv] = t @ (kc * (bc * gc.exp())[:, None])
                u[rows, hv] = t @ (x["v"][rows, hv].float() * bc[:, None])
    return q_hat, k_hat, g_cum, w, u


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_wy_matches_linalg(dtype, assert_close):
    # Keys near one direction (|k̂_i·k̂_j| near 1), strong writes and slow decay make A large and
    # dense, so T = (I + A)^-1 is far from I in every block.
    lengths = [150, 64, 17]
    x = make_inputs(sum(lengths), seed=13, dtype=dtype)
    x["k"] = x["k"].float() * 0.3 + torch.randn(K, generator=torch.Generator().manual_seed(1))
    x["k"] = x["k"].to(dtype)
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    g, beta = g * 0.01, (beta * 0.5 + 0.5).to(dtype)
    wy = chunk.chunk_wy(
        x["q"], x["k"], x["v"], g, beta=beta,
        cu_seqlens=varlen(lengths), scale=0.5, use_qk_l2norm=True, launch=chunk.LAUNCH,
    )  # fmt: skip
    expected = wy_ref(x, g, beta, lengths, scale=0.5)
    assert_close(wy.g_cum, expected[2], torch.float32)
    for actual, want in zip(wy[:2] + wy[3:], expected[:2] + expected[3:], strict=True):
        assert actual.dtype == dtype
        assert_close(actual, want)


LAUNCH_CHOICES = [
    chunk.ChunkLaunch(out_chunks=1, solve_width=16, state_bv=16, out_bk=16, out_bv=16),
    chunk.ChunkLaunch(out_chunks=2, solve_width=32, state_bv=32, out_bk=32, out_bv=64),
    chunk.ChunkLaunch(out_chunks=4, solve_width=64, state_bv=64, out_bk=64, out_bv=32),
    chunk.ChunkLaunch(out_chunks=8, solve_warps=2, state_warps=2, out_warps=4, out_stages=3),
]


@pytest.mark.parametrize("launch", LAUNCH_CHOICES, ids=["by1", "by2", "by4", "by8"])
def test_chunk_launch_choices(launch, monkeypatch, assert_close):
    # Tilings the H200 sweep may pick: column steps of the solve, the state kernel's V tile,
    # output blocks of 1, 2, 4 and 8 chunks (a padding row and partial blocks included).
    monkeypatch.setattr(chunk, "LAUNCH", launch)
    lengths, slots, has_init = [1, 150, 64, 65], [0, 1, -1, 2], [True, False, True, True]
    x = make_inputs(sum(lengths), seed=14, num_slots=3)
    wide = make_inputs(sum(lengths), seed=15)
    x["q"], x["k"] = torch.cat([x["q"], wide["q"]], 2), torch.cat([x["k"], wide["k"]], 2)
    x["v"] = torch.cat([x["v"], wide["v"], x["v"] * 0.5, wide["v"]], 2)
    x["state"] = torch.randn(3, HV, 4 * V, 2 * K) * 0.1
    o, state = run_chunk(chunk_gated_delta_rule, x, lengths, slots, has_init)
    o_ref, state_ref = run_chunk(chunk_gated_delta_rule_ref, x, lengths, slots, has_init)
    assert_close(o, o_ref)
    assert_close(state, state_ref)


@pytest.mark.gpu
def test_chunk_long_sequence_gpu(assert_close):
    # Past 2,048 tokens: 34 chunks of state carried in one sequence, beside a short one.
    lengths = [2113, 40]
    inputs = make_inputs(sum(lengths), seed=16, dtype=torch.bfloat16, num_slots=2)
    x = {name: t.to("cuda") for name, t in inputs.items()}
    o, state = run_chunk(chunk_gated_delta_rule, x, lengths, [1, 0], [True, False])
    o_ref, state_ref = run_chunk(chunk_gated_delta_rule_ref, x, lengths, [1, 0], [True, False])
    assert_close(o, o_ref)
    assert_close(state, state_ref, torch.bfloat16)


def test_chunk_launch_rejects_bad_choices():
    with pytest.raises(ValueError, match="state_bv is 24"):
        chunk.ChunkLaunch(state_bv=24)
    with pytest.raises(ValueError, match="out_chunks is 3"):
        dataclasses.replace(chunk.LAUNCH, out_chunks=3)
    with pytest.raises(ValueError, match="solve_warps is 3"):
        chunk.ChunkLaunch(solve_warps=3)
    with pytest.raises(ValueError, match="few_solve_warps is 5"):
        chunk.ChunkLaunch(few_solve_warps=5)


@pytest.mark.parametrize(
    ("num_tokens", "expected"), [(1, 2), (54, 2), (200, 2), (320, 1), (1024, 1), (4096, 1)]
)
def test_solve_warps_at_the_27b_shape_on_an_h200(num_tokens, expected):
    """48 value heads, 132 SMs, one sequence: the chunk table's bound (T // 64 + 1 chunks) times
    the heads decides; up to two programs an SM take two warps."""
    num_programs = 48 * (num_tokens // chunk.BT + 1)
    assert chunk.choose_solve_warps(num_programs, 132, chunk.LAUNCH) == expected


def run_decode(fn, x: dict, slots: list[int], state: torch.Tensor) -> torch.Tensor:
    slots_t = torch.tensor(slots, device=state.device)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], state)
    return fn(*args, state_slots=slots_t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recurrent_batch(dtype, assert_close, assert_same_bits):
    x = make_inputs(5, seed=20, dtype=dtype, num_slots=6)
    slots = [4, -1, 0, 5, 2]
    state, state_ref = x["state"].clone(), x["state"].clone()
    o = run_decode(fused_recurrent_gated_delta_rule, x, slots, state)
    o_ref = run_decode(fused_recurrent_gated_delta_rule_ref, x, slots, state_ref)
    assert o.dtype == dtype
    assert_close(o, o_ref)
    assert_close(state, state_ref, torch.float32)
    assert o[1].abs().max() == 0
    assert_same_bits(state[1], x["state"][1])  # slots no row names are left alone
    assert_same_bits(state[3], x["state"][3])


@pytest.mark.parametrize("num_seqs", [3, 9], ids=["whole-heads", "v-tiles"])
def test_recurrent_key_and_value_dims_differ(num_seqs, assert_close):
    # K = 32, V = 64: the pool's [V, K] heads are read and written the right way round, by whole
    # heads (with the norm, few rows) and by V tiles (more rows), and hand over to the prefill.
    x = make_inputs(num_seqs, seed=24, num_slots=num_seqs + 1)
    wide = make_inputs(num_seqs, seed=25, num_slots=num_seqs + 1)
    x["q"], x["k"] = torch.cat([x["q"], wide["q"]], 2), torch.cat([x["k"], wide["k"]], 2)
    x["v"] = torch.cat([x["v"], wide["v"], x["v"] * 0.5, wide["v"]], 2)
    x["state"] = torch.randn(num_seqs + 1, HV, 4 * V, 2 * K) * 0.1
    slots = list(range(num_seqs, 0, -1))
    z, weight = torch.randn(num_seqs, HV, 4 * V), torch.rand(4 * V) + 0.5
    norm = {"norm_gate": z, "norm_weight": weight, "norm_eps": 1e-6}
    args = tuple(x[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    state, state_ref = x["state"].clone(), x["state"].clone()
    slots_t = torch.tensor(slots)
    o = fused_recurrent_gated_delta_rule(*args, state, state_slots=slots_t, **norm)
    o_ref = fused_recurrent_gated_delta_rule_ref(*args, state_ref, state_slots=slots_t, **norm)
    assert_close(o, o_ref)
    assert_close(state, state_ref)
    step = {n: t for n, t in x.items() if n != "state"} | {"state": state}
    o, state = run_chunk(chunk_gated_delta_rule, step, [1] * num_seqs, slots, [True] * num_seqs)
    step["state"] = state_ref
    o_ref, state_ref = run_chunk(
        chunk_gated_delta_rule_ref, step, [1] * num_seqs, slots, [True] * num_seqs
    )
    assert_close(o, o_ref)
    assert_close(state, state_ref)


@pytest.mark.parametrize("num_seqs", [3, 9], ids=["in-kernel-norm", "norm-launched-after"])
def test_recurrent_early_state_gives_the_same_bits(num_seqs, assert_same_bits):
    """States read before the dependent-launch wait: the same outputs and states (at V = 16 both
    take 16-row V tiles: the same shapes)."""
    x = make_inputs(num_seqs, seed=23, dtype=torch.bfloat16, num_slots=num_seqs + 2)
    slots = torch.tensor([(i + 2) % (num_seqs + 2) for i in range(num_seqs)])
    slots[1] = -1
    z, weight = torch.randn(num_seqs, HV, V).to(torch.bfloat16), torch.randn(V)
    args = tuple(x[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    runs = []
    for early in (False, True):
        state = x["state"].clone()
        o = fused_recurrent_gated_delta_rule(
            *args, state, state_slots=slots, norm_gate=z, norm_weight=weight, early_state=early
        )
        runs.append((o, state))
    assert_same_bits(runs[0][0], runs[1][0])
    assert_same_bits(runs[0][1], runs[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_dtype", ["input", "fp32"])
@pytest.mark.parametrize("num_seqs", [3, 9], ids=["in-kernel", "launched-after"])
def test_recurrent_fused_gated_norm_equals_the_norm_after(
    dtype, weight_dtype, num_seqs, assert_close, assert_same_bits
):
    # The model's gate z is a strided view of the packed projection; a padding row stays zero.
    x = make_inputs(num_seqs, seed=22, dtype=dtype, num_slots=10)
    slots = [4, -1, 0, 5, 2, 9, 7, 3, 8][:num_seqs]
    packed = torch.randn(num_seqs, HV * V + 24, generator=torch.Generator().manual_seed(3))
    z = packed.to(dtype)[:, 8 : 8 + HV * V].view(num_seqs, HV, V)
    weight = torch.rand(V, generator=torch.Generator().manual_seed(4)) + 0.5
    weight = weight.to(dtype if weight_dtype == "input" else torch.float32)
    norm = {"norm_gate": z, "norm_weight": weight, "norm_eps": 1e-5}
    state, state_plain, state_ref = (x["state"].clone() for _ in range(3))
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    slots_t = torch.tensor(slots)
    o = fused_recurrent_gated_delta_rule(*args, state, state_slots=slots_t, **norm)
    plain = fused_recurrent_gated_delta_rule(*args, state_plain, state_slots=slots_t)
    assert_close(o, gated_rms_norm(plain, z, weight, 1e-5))  # a norm in another kernel's tiles
    assert_same_bits(state, state_plain)  # the norm leaves the state update alone
    o_ref = fused_recurrent_gated_delta_rule_ref(*args, state_ref, state_slots=slots_t, **norm)
    assert_close(o, o_ref)
    assert o[1].abs().max() == 0


def _decode_with_norm(x: dict, rows: list[int], seed: int) -> torch.Tensor:
    """The recurrent op with the gated norm over the given rows of x (slot = row), on x's device."""
    gen = torch.Generator().manual_seed(seed)
    num_rows, (_, num_v_heads, head_v) = x["v"].shape[0], x["v"].shape
    z = torch.randn(num_rows, num_v_heads, head_v, generator=gen).to(x["v"])
    weight = (torch.rand(head_v, generator=gen) + 0.5).to(x["v"])
    state = x["state"].clone()
    args = [x[n][rows] for n in ("q", "k", "v", "a", "b")] + [x["A_log"], x["dt_bias"], state]
    return fused_recurrent_gated_delta_rule(
        *args, state_slots=torch.tensor(rows, device=state.device), norm_gate=z[rows],
        norm_weight=weight, norm_eps=1e-6,
    )  # fmt: skip


def _check_decode_rows_batch_invariant(x: dict, check) -> None:
    # Inside batch_invariant a row's output (check: its bits on the GPU) does not depend on how
    # many rows share the launch, on either side of the small/large batch switch.
    num_rows = x["v"].shape[0]
    with batch_invariant("decode"):
        together = _decode_with_norm(x, list(range(num_rows)), seed=5)
        for r in (0, num_rows - 1):
            check(_decode_with_norm(x, [r], seed=5)[0], together[r])
        check(_decode_with_norm(x, list(range(3)), seed=5), together[:3])


def test_recurrent_with_norm_batch_invariant(assert_close):
    # Within tolerance: under the interpreter launches of other batch sizes are numpy's sums of
    # other shapes; the GPU test below asserts the bits.
    _check_decode_rows_batch_invariant(make_inputs(12, seed=23, num_slots=12), assert_close)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gating(dtype):
    x = make_inputs(37, seed=21, dtype=dtype)
    x["a"][0, 0] = 30.0  # softplus takes its linear branch
    g, beta = gdn_gating(x["a"], x["b"], x["A_log"], x["dt_bias"])
    g_ref, beta_ref = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    assert g.dtype == beta.dtype == torch.float32
    torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(beta, beta_ref, atol=1e-6, rtol=1e-6)


def test_state_handoff_prefill_then_decode(assert_close):
    # Prefill 66 tokens (chunked), then decode 3 (recurrent): equals the reference over all 69.
    num_prefill, total = 66, 69
    x = make_inputs(total, seed=30, dtype=torch.bfloat16, num_slots=2)
    prefill = {n: t[:num_prefill] if t.shape[0] == total else t for n, t in x.items()}
    o_pre, state = run_chunk(chunk_gated_delta_rule, prefill, [num_prefill], [1], [False])
    outs = [o_pre]
    for t in range(num_prefill, total):
        step = {n: t_[t : t + 1] if t_.shape[0] == total else t_ for n, t_ in x.items()}
        outs.append(run_decode(fused_recurrent_gated_delta_rule, step, [1], state))
    o_ref, state_ref = run_chunk(chunk_gated_delta_rule_ref, x, [total], [1], [False])
    assert_close(torch.cat(outs), o_ref)
    assert_close(state, state_ref, torch.bfloat16)


def test_launchers_reject_bad_inputs():
    x = make_inputs(8, seed=40)
    g, beta = gdn_gating_ref(x["a"], x["b"], x["A_log"], x["dt_bias"])
    kw: dict[str, Any] = {
        "cu_seqlens": varlen([8]),
        "state_slots": torch.tensor([0]),
        "has_initial_state": torch.tensor([False]),
    }
    args = (x["q"], x["k"], x["v"])
    with pytest.raises(TypeError, match=r"g has dtype torch\.bfloat16"):
        chunk_gated_delta_rule(*args, g.bfloat16(), beta, x["state"], **kw)
    with pytest.raises(ValueError, match="state has shape"):
        chunk_gated_delta_rule(*args, g, beta, x["state"][:, :, :8], **kw)
    two_slots: dict[str, Any] = kw | {"state_slots": torch.tensor([0, 1])}
    with pytest.raises(ValueError, match="state_slots has shape"):
        chunk_gated_delta_rule(*args, g, beta, x["state"], **two_slots)
    with pytest.raises(ValueError, match="expected the last two dims dense"):
        chunk_gated_delta_rule(
            x["q"].transpose(0, 1).contiguous().transpose(0, 1),
            *args[1:],
            g,
            beta,
            x["state"],
            **kw,
        )
    with pytest.raises(ValueError, match="state has strides"):
        run_decode(fused_recurrent_gated_delta_rule, x, [0] * 8, x["state"].transpose(2, 3))
    decode = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], x["state"])
    slots = torch.zeros(8, dtype=torch.int64)
    with pytest.raises(ValueError, match="norm_gate and norm_weight together"):
        fused_recurrent_gated_delta_rule(*decode, state_slots=slots, norm_gate=x["v"])
    with pytest.raises(ValueError, match="norm_gate needs dense heads"):
        fused_recurrent_gated_delta_rule(
            *decode, state_slots=slots, norm_gate=x["v"].transpose(1, 2).contiguous().mT,
            norm_weight=torch.ones(V),
        )  # fmt: skip
    with pytest.raises(ValueError, match="H >= 1"):
        chunk_gated_delta_rule(x["q"][:, :0], x["k"][:, :0], x["v"], g, beta, x["state"], **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[8192], [1, 4000, 63, 65, 1000]])
def test_chunk_real_shapes_gpu(lengths):
    gen = torch.Generator(device="cuda").manual_seed(50)
    T, nh, nhv, dk = sum(lengths), 16, 48, 128
    q, k = (
        torch.randn(T, nh, dk, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in "qk"
    )
    v = torch.randn(T, nhv, dk, device="cuda", generator=gen, dtype=torch.bfloat16)
    a = torch.randn(T, nhv, device="cuda", generator=gen, dtype=torch.bfloat16)
    b = torch.randn(T, nhv, device="cuda", generator=gen, dtype=torch.bfloat16)
    A_log = torch.rand(nhv, device="cuda", generator=gen) * 2.0
    dt_bias = torch.randn(nhv, device="cuda", generator=gen)
    state = torch.randn(len(lengths) + 1, nhv, dk, dk, device="cuda", generator=gen) * 0.1
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    kw: dict[str, Any] = {
        "cu_seqlens": varlen(lengths, "cuda"),
        "state_slots": torch.arange(len(lengths), device="cuda") + 1,
        "has_initial_state": torch.arange(len(lengths), device="cuda") % 2 == 0,
    }
    s, s_ref = state.clone(), state.clone()
    o = chunk_gated_delta_rule(q, k, v, g, beta, s, **kw)
    o_ref = chunk_gated_delta_rule_ref(q, k, v, g, beta, s_ref, **kw)
    torch.testing.assert_close(o.float(), o_ref.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(s, s_ref, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 64])
def test_recurrent_real_shapes_gpu(num_seqs, assert_close, assert_same_bits_across_shapes):
    gen = torch.Generator(device="cuda").manual_seed(51)
    nh, nhv, dk = 16, 48, 128

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=dtype)

    x = {"q": randn(num_seqs, nh, dk), "k": randn(num_seqs, nh, dk), "v": randn(num_seqs, nhv, dk)}
    x |= {"a": randn(num_seqs, nhv), "b": randn(num_seqs, nhv)}
    x |= {"A_log": randn(nhv, dtype=torch.float32), "dt_bias": randn(nhv, dtype=torch.float32)}
    state = randn(num_seqs + 2, nhv, dk, dk, dtype=torch.float32) * 0.1
    slots = list(range(num_seqs))
    slots[0] = -1
    s, s_ref = state.clone(), state.clone()
    o = run_decode(fused_recurrent_gated_delta_rule, x, slots, s)
    o_ref = run_decode(fused_recurrent_gated_delta_rule_ref, x, slots, s_ref)
    assert_close(o, o_ref)
    assert_close(s, s_ref, torch.float32)
    # The early state read takes smaller V tiles: the same bits.
    s_early = state.clone()
    args = tuple(x[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    slots_t = torch.tensor(slots, device="cuda")
    o_early = fused_recurrent_gated_delta_rule(
        *args, s_early, state_slots=slots_t, early_state=True
    )
    assert_same_bits_across_shapes(o_early, o)
    assert_same_bits_across_shapes(s_early, s)
    # The gated norm fused in (whole heads per program, few rows) or launched after.
    z, weight = randn(num_seqs, nhv, dk), randn(dk) * 0.1 + 1.0
    s_fused = state.clone()
    fused = fused_recurrent_gated_delta_rule(
        *args, s_fused, state_slots=slots_t, norm_gate=z, norm_weight=weight, norm_eps=1e-6
    )
    assert_close(fused, gated_rms_norm(o, z, weight, 1e-6))
    assert_close(s_fused, s, torch.float32)


@pytest.mark.gpu
def test_recurrent_with_norm_batch_invariant_real_shapes_gpu(assert_same_bits_across_shapes):
    gen = torch.Generator().manual_seed(52)
    x = {
        "q": torch.randn(12, 16, 128, generator=gen), "k": torch.randn(12, 16, 128, generator=gen),
        "v": torch.randn(12, 48, 128, generator=gen), "a": torch.randn(12, 48, generator=gen),
        "b": torch.randn(12, 48, generator=gen),
    }  # fmt: skip
    x = {n: t.to("cuda", torch.bfloat16) for n, t in x.items()}
    x |= {"A_log": torch.rand(48, device="cuda"), "dt_bias": torch.randn(48, device="cuda")}
    x["state"] = torch.randn(12, 48, 128, 128, device="cuda") * 0.1
    _check_decode_rows_batch_invariant(x, assert_same_bits_across_shapes)
