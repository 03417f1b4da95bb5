"""The embedded model with its shipped DFlash drafter (`--draft-model embedded`), on the CPU and
deterministic: the drafter loads and fits; greedy speculative decoding gives plain decoding's
tokens alone and among other requests; each draft is the one fresh forwards of the drafter give
(its KV follows acceptance: a rejected block's scratch never reaches a later proposal); requests
that join, leave and are aborted give every block and slot back. No acceptance figure is
asserted: the shipped weights are whatever the last training run wrote."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from scheduler_testing import (
    MixedRun,
    recording_block_runner,
    reference_block_drafts,
    run_mixed_steps,
    run_with_random_aborts,
)
from sparkinfer.model.chat_template import ChatOptions, ChatTemplate
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.config import DFLASH
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.drafters.weights import load_drafter, read_drafter_config
from sparkinfer.model.embedded import (
    EMBEDDED_DRAFTER_ID,
    embedded_checkpoint_dir,
    embedded_drafter_dir,
)
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.request import FinishReason, SamplingParams
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1)
REQUESTS = (
    "Write a Python function `is_even(n)`: Return True when n is even.",
    "Give me a Python function `count_vowels(s)`. Return how many vowels s holds.",
)
SOURCE = ("import os\n\n\ndef read_lines(path):\n    ",)


@pytest.fixture(scope="module")
def target() -> Qwen3_8ForCausalLM:
    return load_model(embedded_checkpoint_dir(), device="cpu", dtype=torch.float32, progress=False)


@pytest.fixture(scope="module")
def drafter(target: Qwen3_8ForCausalLM) -> BlockDrafter:
    return load_drafter("embedded", target, progress=False).eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Chat requests (thinking off and on) and raw source openings, as the server encodes them."""
    tok = Tokenizer.from_checkpoint(embedded_checkpoint_dir())
    template = ChatTemplate.builtin(tok)
    out = []
    for i, text in enumerate(REQUESTS):
        options = ChatOptions(enable_thinking=bool(i % 2))
        rendered = template.render([{"role": "user", "content": text}], options=options)
        out.append(tok.encode_chat(rendered.segments))
    return out + [tok.encode(s) for s in SOURCE]


def config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "block_size": 16, "max_model_len": 256, "max_num_batched_tokens": 64,
        "deterministic": True, "speculative": "draft_model", "speculative_adaptive": False,
    }  # fmt: skip
    return SchedulerConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain(target, prompts) -> tuple[MixedRun, list[MixedRun]]:
    """Every prompt together, and the first two alone, without speculation."""
    off = config(speculative="off")
    together = run_mixed_steps(Runner(target, off), off, prompts, [GREEDY] * len(prompts))
    alone = [run_mixed_steps(Runner(target, off), off, [p], [GREEDY]) for p in prompts[:2]]
    return together, alone


def test_the_shipped_drafter_loads_and_fits_the_embedded_model(target, drafter):
    c = drafter.config
    assert c.layout == DFLASH and c.architecture == "DFlashDraftModel"
    assert c.hidden_size == target.config.text.hidden_size
    assert c.num_drafts == c.block_size - 1 and c.block_size in (8, 16)
    assert target.tap_layers == c.target_layer_ids
    for name in ("embedded", EMBEDDED_DRAFTER_ID, embedded_drafter_dir()):
        assert read_drafter_config(name, target.config.text, progress=False) == c
    assert (embedded_drafter_dir() / "README.md").is_file()  # the model card: how it was made


def test_speculation_gives_plain_decoding_alone_and_among_others(target, drafter, prompts, plain):
    off, alone = plain
    runner, recorded = recording_block_runner(target, drafter, config())
    cfg = runner.config
    assert cfg.num_speculative_tokens == drafter.config.num_drafts
    for p, ref in zip(prompts[:2], alone, strict=True):
        one = run_mixed_steps(runner, cfg, [p], [GREEDY])
        assert one.tokens == ref.tokens
        assert one.logprobs == ref.logprobs
    on = run_mixed_steps(runner, cfg, prompts, [GREEDY] * len(prompts))
    assert on.tokens == off.tokens
    assert recorded.proposals


def test_the_drafters_kv_follows_acceptance(target, drafter, prompts):
    """Prompts in chunks, then decode steps that accept part of a block or none: every proposal
    is the one fresh forwards give, so no rejected draft's scratch K/V reaches a later block."""
    runner, recorded = recording_block_runner(target, drafter, config(max_num_batched_tokens=24))
    run_mixed_steps(runner, runner.config, prompts[1:], [GREEDY] * 2)
    assert len(recorded.proposals) > 3
    same = [d == reference_block_drafts(target, drafter, t, len(d)) for t, d in recorded.proposals]
    assert sum(same) >= 0.9 * len(same), same  # rounding may flip a near tie, rarely


def test_requests_join_leave_and_abort_with_no_leaks(target, drafter, prompts, plain):
    """Requests queued over time, some aborted, a small KV pool (preemption): every finished
    request gets plain decoding's tokens, and every block and slot comes back."""
    off, _ = plain
    rng = random.Random(3)
    cfg = config(max_num_seqs=3, max_num_batched_tokens=32, num_kv_blocks=14)
    runner = Runner(target, cfg, drafter=drafter)
    cfg = runner.config
    sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots)
    reqs = []

    def add(i: int) -> None:
        p = rng.randrange(len(prompts))
        sp = replace(GREEDY, max_tokens=rng.randint(1, 12))
        reqs.append((sched.add_request(str(i), prompts[p], sp), p))

    run_with_random_aborts(runner, sched, rng, 6, add)
    stats = sched.stats()
    assert stats.spec.num_drafts > 0
    finished = [(r, p) for r, p in reqs if r.finish_reason is FinishReason.LENGTH]
    assert finished
    for req, p in finished:
        assert req.output_token_ids == off.tokens[p][: len(req.output_token_ids)]
    assert sched.blocks.num_free_blocks == cfg.num_kv_blocks
    assert sched.slots.num_free_slots == runner.num_slots
