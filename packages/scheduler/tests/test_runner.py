"""End to end on a tiny random model (CPU): greedy output against the plain reference decode."""

import gc
import itertools
import random
import threading
import weakref
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch
from scheduler_testing import (
    MixedRun,
    reference_greedy,
    reference_logits,
    run_mixed_steps,
    run_steps,
)
from sparkinfer.scheduler.cache_plan import plan_cache
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.errors import CacheAllocationError
from sparkinfer.scheduler.request import RequestOutput, SamplingParams
from sparkinfer.scheduler.runner import Runner

NUM_NEW = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=1)
RNG = random.Random(0)
PROMPTS = [[RNG.randrange(250) for _ in range(RNG.randint(3, 40))] for _ in range(16)]


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"block_size": 16, "max_model_len": 128, **kw})


def run_together(engine: Engine, prompts) -> list[tuple[list[int], list[float]]]:
    """Submit all prompts at once; return each one's tokens and chosen-token logprobs."""
    results = [([], []) for _ in prompts]
    done = threading.Semaphore(0)
    for i, prompt in enumerate(prompts):

        def on_output(out, res=results[i]):
            res[0].extend(out.new_token_ids)
            res[1].extend(lp.logprob for lp in out.logprobs)
            if out.is_finished:
                done.release()

        engine.add_request(f"p{i}-{RNG.random()}", prompt, GREEDY, on_output=on_output)
    for _ in prompts:
        assert done.acquire(timeout=120)
    return results


@pytest.fixture(scope="module")
def references(tiny_model):
    return [reference_greedy(tiny_model, p, NUM_NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def alone(tiny_model):
    engine = Engine.from_model(tiny_model, config(max_num_batched_tokens=128, deterministic=True))
    try:
        yield [run_together(engine, [p])[0] for p in PROMPTS]
    finally:
        engine.shutdown()


def test_alone_matches_reference_decode(alone, references):
    assert [tokens for tokens, _ in alone] == references


@pytest.mark.parametrize("num_concurrent", range(1, 17))
def test_batch_invariant_bitwise(tiny_model, alone, num_concurrent):
    engine = Engine.from_model(tiny_model, config(max_num_batched_tokens=128, deterministic=True))
    try:
        together = run_together(engine, PROMPTS[:num_concurrent])
    finally:
        engine.shutdown()
    assert together == alone[:num_concurrent]  # tokens and logprobs, bit for bit


def test_deterministic_forwards_take_the_invariant_fp8_kernels_never_the_routes(tiny_model):
    """With `deterministic` every forward runs in its phase's batch-invariant mode: the FP8
    dispatch takes the invariant swap-AB (decode) or prompt GEMM at every row count (cuBLAS,
    whose algorithm follows the shape, never); without it, the committed per-row-count routes."""
    from sparkinfer.kernels.fp8_linear import fp8_kernel_for, quantize_weight_fp8

    w, s = quantize_weight_fp8(torch.randn(256, 256))
    rows = (1, 8, 32, 100)

    def kernels(runner: Runner, *, is_decode: bool) -> list[str]:
        with runner.numerics(is_decode=is_decode):
            return [fp8_kernel_for(torch.randn(m, 256), w, s) for m in rows]

    deterministic = Runner(tiny_model, config(deterministic=True))
    assert kernels(deterministic, is_decode=True) == ["swap_ab"] * len(rows)
    assert kernels(deterministic, is_decode=False) == ["prompt"] * len(rows)
    fastest = Runner(tiny_model, config())  # swap-AB to 32 rows; cuBLAS (a CPU x: prompt) beyond
    assert kernels(fastest, is_decode=True) == ["swap_ab", "swap_ab", "swap_ab", "prompt"]


def test_chunked_prefill_equals_one_shot(tiny_model, references):
    engine = Engine.from_model(tiny_model, config(max_num_batched_tokens=7))
    try:
        got = [tokens for tokens, _ in run_together(engine, PROMPTS[:6])]
    finally:
        engine.shutdown()
    assert got == references[:6]


def test_prompt_logprobs_match_a_direct_forward(tiny_model):
    # Chunks of 7 tokens: each prompt is scored across several chunks, next to other requests.
    engine = Engine.from_model(tiny_model, config(max_num_batched_tokens=7))
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    outs: list[list[RequestOutput]] = [[] for _ in range(6)]
    done = threading.Semaphore(0)

    def on_output(out: RequestOutput) -> None:
        outs[int(out.request_id[1:])].append(out)
        if out.is_finished:
            done.release()

    try:
        for i, prompt in enumerate(PROMPTS[:6]):
            engine.add_request(f"s{i}", prompt, params, on_output=on_output)
        for _ in range(6):
            assert done.acquire(timeout=120)
    finally:
        engine.shutdown()
    for i, prompt in enumerate(PROMPTS[:6]):
        got = outs[i][0].prompt_logprobs
        want = torch.log_softmax(reference_logits(tiny_model, prompt)[:-1], dim=-1)
        assert [e.token_id for e in got] == prompt[1:]
        chosen = want.gather(1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(
            torch.tensor([e.logprob for e in got]), chosen, atol=1e-4, rtol=0
        )
        top = want.topk(3, dim=-1)
        assert [[t for t, _ in e.top] for e in got] == top.indices.tolist()
        torch.testing.assert_close(
            torch.tensor([[lp for _, lp in e.top] for e in got]), top.values, atol=1e-4, rtol=0
        )
        assert all(o.prompt_logprobs == () for o in outs[i][1:])


def test_preempted_requests_finish_with_the_same_output(tiny_model, references):
    # 8 blocks of 16 tokens cannot hold 8 sequences of up to 52 tokens at once.
    engine = Engine.from_model(tiny_model, config(num_kv_blocks=8, max_num_batched_tokens=64))
    try:
        got = [tokens for tokens, _ in run_together(engine, PROMPTS[:8])]
        assert engine.stats().num_preemptions > 0
    finally:
        engine.shutdown()
    assert got == references[:8]


def test_mixed_forward_without_determinism_matches_tokens(tiny_model, references):
    engine = Engine.from_model(tiny_model, config(deterministic=False))
    try:
        got = [tokens for tokens, _ in run_together(engine, PROMPTS[:8])]
    finally:
        engine.shutdown()
    assert got == references[:8]


def test_a_reused_state_slot_starts_from_zero_state(tiny_model, references):
    """Every slot holds garbage, as a slot does after its previous request: a request's first
    chunk (has_initial_state False) must not read it, whether it is admitted fresh, resumes after
    a preemption or continues a chunked prompt."""
    cfg = config(num_kv_blocks=4, num_state_slots=2, max_num_batched_tokens=7)
    runner = Runner(tiny_model, cfg)
    for cache in runner.caches.linear.values():
        cache.conv.fill_(1e3)
        cache.recurrent.fill_(-1e3)
    prompts = [(p, None) for p in PROMPTS[:6]]
    got = run_steps(runner, cfg, prompts, SamplingParams(temperature=0.0, max_tokens=NUM_NEW))
    assert got == references[:6]


def test_cpu_cache_sizing_from_budget(tiny_model):
    spec = tiny_model.cache_spec()
    cfg = config(max_num_seqs=4)
    plan = plan_cache(spec, cfg, budget_bytes=1 << 20, cap_blocks=True)
    assert plan.num_slots == 4 and plan.num_blocks == 4 * cfg.max_blocks_per_seq
    runner = Runner(tiny_model, config(num_kv_blocks=5, num_state_slots=3))
    assert (runner.num_blocks, runner.num_slots, runner.vocab_size) == (5, 3, 256)
    with pytest.raises(CacheAllocationError, match="raise gpu_memory_utilization"):
        plan_cache(spec, cfg, budget_bytes=10, cap_blocks=True)


def test_the_verify_stash_comes_out_of_the_cache_budget(tiny_model):
    """Speculation keeps each GDN layer's inputs of every verify row (max_num_seqs sequences of
    k + 1 rows, within the token budget) and no state row per draft."""
    spec = tiny_model.cache_spec()
    budget = 1 << 22
    off = plan_cache(spec, config(max_num_seqs=4, num_state_slots=4), budget_bytes=budget,
                     cap_blocks=False)  # fmt: skip
    cfg = config(max_num_seqs=4, num_state_slots=4, speculative="ngram", num_speculative_tokens=3)
    on = plan_cache(spec, cfg, budget_bytes=budget, cap_blocks=False)
    assert (off.num_verify_rows, on.num_verify_rows) == (0, 16)
    assert on.num_slots == off.num_slots and on.num_snapshots == off.num_snapshots
    block_bytes = spec.kv_bytes_per_token() * cfg.block_size
    stash = 16 * spec.verify_bytes_per_row()
    state = (on.num_snapshots + 4) * spec.state_bytes_per_slot()
    assert on.num_blocks == (budget - state - stash) // block_bytes < off.num_blocks
    runner = Runner(tiny_model, replace(cfg, num_kv_blocks=8))
    stashes = [c.verify for c in runner.caches.linear.values()]
    assert all(s is not None and s.conv_in.shape[0] == 16 for s in stashes)


def test_a_shut_down_engine_frees_its_caches(tiny_model):
    # An engine started next in the same process sizes its caches from free memory.
    engine = Engine.from_model(tiny_model, config(num_kv_blocks=5, num_state_slots=3))
    runner = engine.runner
    assert engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2))
    layer = next(iter(runner.caches.linear))
    recurrent = weakref.ref(runner.caches.linear[layer].recurrent)
    kv = weakref.ref(next(iter(runner.caches.attention.values())).k)
    engine.shutdown()
    gc.collect()
    assert recurrent() is None and kv() is None
    with pytest.raises(RuntimeError, match="start a new engine"):
        runner.run(engine.scheduler.schedule())


def _ban_token_0(output_token_ids: object, row: torch.Tensor) -> None:
    row[0] = float("-inf")


def _chain(token_id: int | None) -> int:
    return 5 if token_id is None else (31 * token_id + 7) % 200


def _follow_last_token(output_token_ids: Sequence[int], row: torch.Tensor) -> None:
    """Allow only _chain(the last output token): each token is a function of the one before."""
    allowed = _chain(output_token_ids[-1] if output_token_ids else None)
    keep = row[allowed].clone()
    row.fill_(float("-inf"))
    row[allowed] = keep


def test_logits_processor_steps_overlap_and_see_every_earlier_token(tiny_model):
    """A processor that reads the request's last token must see it even when the step that drew
    it is still in flight as the next step runs: the step before is read ahead of the draw, and
    the steps keep overlapping."""
    chained = SamplingParams(
        temperature=0.0, max_tokens=NUM_NEW, logits_processor=_follow_last_token
    )
    params = [chained] * 3 + [SamplingParams(temperature=0.0, max_tokens=NUM_NEW)]

    def generate(overlap: bool) -> MixedRun:
        cfg = config(max_num_batched_tokens=64, overlap_steps=overlap, deterministic=True)
        return run_mixed_steps(Runner(tiny_model, cfg), cfg, PROMPTS[: len(params)], params)

    at_once, overlapped = generate(False), generate(True)
    assert overlapped.tokens == at_once.tokens
    assert overlapped.num_late_steps >= NUM_NEW - 1 and at_once.num_late_steps == 0
    for tokens in at_once.tokens[:3]:
        assert len(tokens) == NUM_NEW and tokens[0] == _chain(None)
        assert all(b == _chain(a) for a, b in itertools.pairwise(tokens))


def test_overlapped_steps_give_the_tokens_of_steps_read_at_once(tiny_model, references):
    """With a step's samples left in flight (decode inputs taken on the device, samples read a
    step later) every request gets the tokens and logprobs it gets when each step is read at
    once: greedy, seeded draws, penalties (counting an output still in flight), a logits
    processor and a stop id, under preemption. Batch-invariant
    numerics: a stopped request's extra row changes its step's batch, which must not change
    anyone's bits."""
    stop = references[3][4]
    params = [
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=2),
        SamplingParams(temperature=0.9, seed=7, max_tokens=NUM_NEW),
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW, frequency_penalty=2.0),
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW, stop_token_ids=(stop,)),
    ] * 2
    params.append(SamplingParams(temperature=0.0, max_tokens=3, logits_processor=_ban_token_0))

    def generate(overlap: bool) -> MixedRun:
        cfg = config(
            num_kv_blocks=6, max_num_batched_tokens=40, overlap_steps=overlap, deterministic=True
        )
        run = run_mixed_steps(Runner(tiny_model, cfg), cfg, PROMPTS[: len(params)], params)
        assert (run.num_late_steps > 0) == overlap
        return run

    at_once, overlapped = generate(False), generate(True)
    assert overlapped.tokens == at_once.tokens and overlapped.num_preemptions > 0
    assert overlapped.logprobs == at_once.logprobs and len(at_once.logprobs[0]) == NUM_NEW
    assert all(len(lp.top) == 2 for lp in at_once.logprobs[0])
    tokens = at_once.tokens
    assert tokens[0] == references[0] and tokens[4] == references[4]
    assert tokens[3] == references[3][: references[3].index(stop) + 1]


def test_every_device_step_runs_under_the_configs_kernel_tuning(tiny_model, monkeypatch):
    """The runner passes the config's `KernelTuning` to the kernels of every forward and device
    step (not a process-wide switch): the model sees it, and it is gone after the step."""
    from sparkinfer.kernels.linear.shape_table import ShapeTable
    from sparkinfer.kernels.tuning import DEFAULT_TUNING, current_tuning

    cfg = config(dependent_launch=False, shape_table=ShapeTable.load(), num_kv_blocks=16)
    runner = Runner(tiny_model, cfg)
    assert runner.kernel_tuning == cfg.kernel_tuning and not cfg.kernel_tuning.use_dependent_launch
    seen = []
    forward = type(tiny_model).forward
    monkeypatch.setattr(
        type(tiny_model),
        "forward",
        lambda self, *a, **kw: (seen.append(current_tuning()), forward(self, *a, **kw))[1],
    )
    engine = Engine(runner, cfg)
    try:
        assert len(engine.generate(PROMPTS[0], GREEDY)) == NUM_NEW
    finally:
        engine.shutdown()
    assert seen and all(t is runner.kernel_tuning for t in seen)
    assert current_tuning() is DEFAULT_TUNING
