"""The block drafter of `--draft-model` on the tiny random model with a tiny random DFlash
drafter (CPU, deterministic): the output is plain decoding's alone and among other requests,
as requests join, leave and are aborted, with nothing leaked; each draft is the one the drafter
gives from plain forwards over the whole sequence (its KV follows acceptance)."""

from __future__ import annotations

import logging
import random
from dataclasses import replace

import pytest
import torch
from scheduler_testing import (
    TINY_DRAFTER_BLOCK,
    MixedRun,
    RecordingBlockDrafter,
    build_tiny_block_drafter,
    build_tiny_model,
    recording_block_runner,
    reference_block_drafts,
    reference_greedy,
    run_mixed_steps,
    run_with_random_aborts,
)
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.request import FinishReason, SamplingParams
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.scheduler import Scheduler
from sparkinfer.scheduler.speculative.block_drafter import DraftModelDrafter

RNG = random.Random(11)
PROMPTS = [[RNG.randrange(250) for _ in range(RNG.randint(3, 40))] for _ in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, logprobs=1)
BLOCK = TINY_DRAFTER_BLOCK  # 4 drafts a step


@pytest.fixture(scope="module")
def target() -> Qwen3_8ForCausalLM:
    return build_tiny_model(seed=0)


def build_drafter(target: Qwen3_8ForCausalLM) -> BlockDrafter:
    """The tiny DFlash drafter beside `target` (its device and dtype, values drawn on the CPU);
    sets the target's tap layers."""
    out, config = build_tiny_block_drafter(target, torch.Generator().manual_seed(5))
    target.set_tap_layers(config.target_layer_ids)
    return out.eval()


@pytest.fixture(scope="module")
def drafter(target) -> BlockDrafter:
    return build_drafter(target)


def config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "block_size": 16, "max_model_len": 128, "max_num_batched_tokens": 128,
        "deterministic": True, "speculative": "draft_model", "speculative_adaptive": False,
    }  # fmt: skip
    return SchedulerConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain(target, drafter) -> tuple[MixedRun, list[MixedRun]]:
    """Every prompt together, and the first two alone, without speculation."""
    off = config(speculative="off")
    together = run_mixed_steps(Runner(target, off), off, PROMPTS, [GREEDY] * len(PROMPTS))
    alone = [run_mixed_steps(Runner(target, off), off, [p], [GREEDY]) for p in PROMPTS[:2]]
    return together, alone


def test_block_drafter_speculation_gives_plain_decoding_bit_for_bit(target, drafter, plain):
    off, alone = plain
    cfg = config(max_num_batched_tokens=48)  # prompts in chunks beside verify rows
    runner, _ = recording_block_runner(target, drafter, cfg)
    assert runner.config.num_speculative_tokens == BLOCK - 1  # the drafter's block
    cfg = runner.config  # the scheduler drafts as deep as the resolved config says
    for p in PROMPTS[:2]:
        one = run_mixed_steps(runner, cfg, [p], [GREEDY])
        assert one.tokens == alone[PROMPTS.index(p)].tokens
        assert one.logprobs == alone[PROMPTS.index(p)].logprobs
    on = run_mixed_steps(runner, cfg, PROMPTS, [GREEDY] * len(PROMPTS))
    assert on.tokens == off.tokens  # tokens only: prompt chunks are cut differently
    drafter_run = runner.speculative.drafter
    assert isinstance(drafter_run, RecordingBlockDrafter) and drafter_run.proposals
    assert max(len(d) for _, d in drafter_run.proposals) == BLOCK - 1


def test_every_draft_is_the_one_plain_forwards_of_the_drafter_give(target, drafter):
    cfg = config(max_num_batched_tokens=20)  # prompts in chunks
    runner, _ = recording_block_runner(target, drafter, cfg)
    run_mixed_steps(runner, runner.config, PROMPTS[:3], [replace(GREEDY, max_tokens=14)] * 3)
    recorded = runner.speculative.drafter
    assert isinstance(recorded, RecordingBlockDrafter) and len(recorded.proposals) > 5
    same = [
        d == reference_block_drafts(target, drafter, t, len(d)) for t, d in recorded.proposals
    ]  # rounding may flip a near tie, rarely
    assert sum(same) >= 0.9 * len(same), same


def test_tapped_verify_graphs_give_plain_decoding_and_the_drafter_its_taps(
    target, drafter, plain, monkeypatch
):
    """The verify graphs captured tapped (`use_taps`; captured and replayed on the CPU
    stand-ins): the tokens stay plain decoding's, and every draft is still the one plain
    forwards give, so each replay's tap rows reached the drafter's cache."""
    from scheduler_testing import attach_cpu_verify_graphs

    off, _ = plain
    runner, _ = recording_block_runner(target, drafter, config(max_num_seqs=4))
    cfg = runner.config
    replays = attach_cpu_verify_graphs(runner, monkeypatch, num_drafts=BLOCK - 1, use_taps=True)
    got = run_mixed_steps(runner, cfg, PROMPTS, [GREEDY] * len(PROMPTS))
    assert len(set(replays.verifies)) >= 2  # padded buckets and a full one
    assert got.tokens == off.tokens
    recorded = runner.speculative.drafter
    assert isinstance(recorded, RecordingBlockDrafter) and len(recorded.proposals) > 5
    same = [d == reference_block_drafts(target, drafter, t, len(d)) for t, d in recorded.proposals]
    assert sum(same) >= 0.9 * len(same), same


def test_requests_join_leave_and_abort_with_no_leaks(target, drafter, plain):
    """Requests queued over time, some aborted, a small KV pool (preemption): every finished
    request gets plain decoding's tokens, and every block and slot comes back."""
    off, _ = plain
    rng = random.Random(7)
    cfg = config(max_num_seqs=4, max_num_batched_tokens=24, num_kv_blocks=12)
    runner = Runner(target, cfg, drafter=drafter)
    cfg = runner.config
    sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots)
    reqs = []

    def add(i: int) -> None:
        p = rng.randrange(len(PROMPTS))
        sp = replace(GREEDY, max_tokens=rng.randint(1, 10))
        reqs.append((sched.add_request(str(i), PROMPTS[p], sp), p))

    run_with_random_aborts(runner, sched, rng, 20, add)
    stats = sched.stats()
    assert stats.num_aborted > 0 and stats.spec.num_drafts > 0
    finished = [(r, p) for r, p in reqs if r.finish_reason is FinishReason.LENGTH]
    assert finished
    for req, p in finished:
        assert req.output_token_ids == off.tokens[p][: len(req.output_token_ids)]
        assert len(req.output_token_ids) == req.params.max_tokens
    assert sched.blocks.num_free_blocks == cfg.num_kv_blocks
    assert sched.slots.num_free_slots == runner.num_slots


def test_auto_drafts_with_the_draft_model_and_says_so(target, drafter, caplog):
    with caplog.at_level(logging.INFO, logger="sparkinfer.scheduler.runner"):
        engine = Engine.from_model(target, config(speculative="auto"), drafter=drafter)
    try:
        assert engine.scheduler.config.speculative == "draft_model"
        assert isinstance(engine.runner.speculative.drafter, DraftModelDrafter)  # type: ignore[attr-defined]
        assert "speculative auto: the block drafter of --draft-model drafts up to 4" in caplog.text
    finally:
        engine.shutdown()


def test_draft_model_without_a_drafter_is_refused(target):
    with pytest.raises(ValueError, match="no block drafter is loaded"):
        Runner(target, config())


def test_drafts_after_a_prefix_cache_hit_read_the_drafters_kv_of_the_cached_blocks(target, drafter):
    """The first request drafts (rejections included) after its prompt is cached; the second
    resumes from the cached blocks: both get plain decoding's tokens, and the second's drafts
    are the plain forwards' (the cached pages hold its context's drafter K/V, no scratch)."""
    rng = random.Random(1)
    stem = [rng.randrange(250) for _ in range(300)]
    prompts = [stem, [*stem[:270], *(rng.randrange(250) for _ in range(30))]]
    cfg = config(
        max_model_len=512, max_num_batched_tokens=512, prefix_cache_min_tokens=128,
        prefix_cache_snapshots=2,
    )  # fmt: skip
    runner, _ = recording_block_runner(target, drafter, cfg)
    recorded = runner.speculative.drafter
    assert isinstance(recorded, RecordingBlockDrafter)
    sched = Scheduler(
        runner.config, num_blocks=runner.num_blocks, num_slots=runner.num_slots,
        snapshot_rows=runner.snapshot_rows,
    )  # fmt: skip
    params = replace(GREEDY, max_tokens=8)
    for i, prompt in enumerate(prompts):
        req = sched.add_request(str(i), prompt, params)
        while sched.has_work():
            batch = sched.schedule()
            sched.update(batch, runner.run(batch))
        assert req.output_token_ids == reference_greedy(target, prompt, 8)
    assert sched.stats().num_prefix_cached_tokens == 256
    second = [(t, d) for t, d in recorded.proposals if t[:300] == prompts[1]]
    assert second
    same = [d == reference_block_drafts(target, drafter, t, len(d)) for t, d in second]
    assert sum(same) >= 0.9 * len(same), same


@pytest.mark.gpu
def test_block_drafter_speculation_on_cuda_gives_plain_decoding_bit_for_bit():
    """bf16 on the device, the drafter's linear layers on the Triton kernels, its proposals
    replayed as CUDA graphs, the target's decode and verify graphs captured tapped."""
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    drafter = build_drafter(model)
    cfg = config(max_model_len=256)
    off = replace(cfg, speculative="off")
    want = run_mixed_steps(Runner(model, off), off, PROMPTS, [GREEDY] * len(PROMPTS))
    runner = Runner(model, cfg, drafter=drafter)
    got = run_mixed_steps(runner, runner.config, PROMPTS, [GREEDY] * len(PROMPTS))
    assert got.tokens == want.tokens and got.logprobs == want.logprobs
    made = runner.speculative.drafter
    assert isinstance(made, DraftModelDrafter) and made.graphs is not None
    assert made.graphs.num_graphs() > 0
    assert runner.graphs is not None and runner.graphs.use_taps
    assert runner.verify_graphs is not None and runner.verify_graphs.use_taps
