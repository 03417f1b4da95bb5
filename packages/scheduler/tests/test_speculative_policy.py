"""The scheduler's side of speculation on a fake runner: lookahead rows, accepted drafts kept and
the rest freed, stops among accepted drafts, the adaptive switch, and no leaks."""

from __future__ import annotations

import random

import pytest
from scheduler_testing import FakeRunner, next_token
from sparkinfer.scheduler.batch import ModelOutput, SampledToken, ScheduledBatch, SpecOutcome
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.request import FIRST_COOLDOWN_STEPS, Request, SamplingParams
from sparkinfer.scheduler.scheduler import Scheduler
from sparkinfer.scheduler.speculative.policy import MAX_COOLDOWN_STEPS, PROBE_INTERVAL, SpecPolicy


class FakeSpecRunner(FakeRunner):
    """A decode row with lookahead drafts the fake model's own continuation, one draft in some
    steps wrong (`error_rate`), and accepts them up to the first wrong one."""

    def __init__(self, *, error_rate: float = 0.3, seed: int = 0, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.rng = random.Random(seed)
        self.error_rate = error_rate

    def run(self, batch: ScheduledBatch) -> ModelOutput:
        if not batch.is_read_at_once:
            return super().run(batch)
        self.batches.append(batch)
        before = [
            (p, SampledToken(next_token(p.req.token_ids, self.vocab_size))) for p in self._inflight
        ]
        self._inflight = []
        for s in batch.seqs:
            assert not s.num_lookahead_tokens or not s.is_input_inflight
            held = len(s.req.block_ids) * self.block_size
            assert held >= s.num_cached_tokens + 1 + s.num_lookahead_tokens
        samples, spec = [], {}
        for s in (s for s in batch.seqs if s.is_sampled):
            tokens = list(s.req.token_ids)
            truth = []
            for _ in range(s.num_lookahead_tokens + 1):
                truth.append(next_token(tokens, self.vocab_size))
                tokens.append(truth[-1])
            drafts = [
                t if self.rng.random() > self.error_rate else (t + 1) % self.vocab_size
                for t in truth[: s.num_lookahead_tokens]
            ]
            a = next(
                (j for j, (d, t) in enumerate(zip(drafts, truth, strict=False)) if d != t),
                len(drafts),
            )
            samples += [(s, SampledToken(t)) for t in truth[: a + 1]]
            if drafts:
                spec[s.req.request_id] = SpecOutcome(len(drafts), a)
        return ModelOutput(samples=tuple(before + samples), spec=spec)


def config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "block_size": 4, "max_model_len": 128, "speculative": "ngram",
        "speculative_adaptive": False, "num_speculative_tokens": 3,
    }  # fmt: skip
    return SchedulerConfig(**{**base, **kw})  # type: ignore[arg-type]


def drain(sched: Scheduler, runner: FakeRunner) -> None:
    while sched.has_work():
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))


def outputs(cfg: SchedulerConfig, runner: FakeRunner, prompts, params) -> list[list[int]]:
    sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots, vocab_size=100)
    reqs = [
        sched.add_request(str(i), p, sp)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    drain(sched, runner)
    return [r.output_token_ids for r in reqs]


@pytest.mark.parametrize("overlap", [False, True])
def test_speculation_keeps_the_output_with_stops_and_length_limits(overlap):
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 100) for _ in range(rng.randint(1, 30))] for _ in range(12)]
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 20)) for _ in prompts]
    plain = outputs(config(speculative="off"), FakeRunner(overlap=overlap), prompts, params)
    stops = [SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(o[len(o) // 2],))
             for o in plain]  # fmt: skip
    plain_stops = outputs(config(speculative="off"), FakeRunner(overlap=overlap), prompts, stops)
    runner = FakeSpecRunner(overlap=overlap)
    assert outputs(config(), runner, prompts, params) == plain
    assert outputs(config(), FakeSpecRunner(overlap=overlap), prompts, stops) == plain_stops
    assert any(s.num_lookahead_tokens for b in runner.batches for s in b.seqs)


def test_lookahead_stays_within_the_budget_the_blocks_and_max_len():
    sched = Scheduler(config(max_num_batched_tokens=6), num_blocks=64, num_slots=8, vocab_size=100)
    runner = FakeSpecRunner(error_rate=0.0)
    reqs = [sched.add_request(str(i), [1 + i] * 3, SamplingParams(max_tokens=9)) for i in range(3)]
    while sched.has_work():
        decoding = [
            r
            for r in sched.running
            if r.num_pending_tokens == 1 and r.num_output_tokens and not r.is_at_max_len
        ]
        batch = sched.schedule()
        assert batch.num_tokens + sum(s.num_lookahead_tokens for s in batch.seqs) <= 6
        assert {s.req for s in batch.seqs if s.is_decode} == set(decoding)  # drafts starve none
        for s in batch.seqs:
            assert s.req.num_tokens + s.num_lookahead_tokens < s.req.max_len
        sched.update(batch, runner.run(batch))
    assert any(s.num_lookahead_tokens == 3 for b in runner.batches for s in b.seqs)
    assert all(r.num_output_tokens == 9 for r in reqs)
    assert sched.blocks.num_free_blocks == 64


def test_requests_with_penalties_or_a_processor_draft_too():
    sched = Scheduler(config(), num_blocks=64, num_slots=8, vocab_size=100)
    runner = FakeSpecRunner()
    sched.add_request("p", [1, 2, 3], SamplingParams(max_tokens=6, presence_penalty=0.5))
    sched.add_request(
        "g", [1, 2, 3], SamplingParams(max_tokens=6, logits_processor=lambda h, r: None)
    )
    drain(sched, runner)
    drafted = {s.req.request_id for b in runner.batches for s in b.seqs if s.num_lookahead_tokens}
    assert drafted == {"p", "g"}


def test_low_acceptance_cools_a_request_down_and_slow_verifies_switch_drafting_off():
    sched = Scheduler(config(speculative_adaptive=True), num_blocks=64, num_slots=8, vocab_size=100)
    _steady_clock(sched)
    runner = FakeSpecRunner(error_rate=1.0)  # every first draft is wrong
    req = sched.add_request("r", [1, 2, 3], SamplingParams(max_tokens=100))
    for _ in range(12):
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))
    assert req.spec.num_verifies >= 2 and req.spec.cooldown_steps > 0
    # Measured: verifies take five times a plain step; even full acceptance does not pay.
    policy = SpecPolicy(config(speculative_adaptive=True))
    for _ in range(8):
        policy.record_step(num_rows=1, is_verify=False, seconds=0.01)
        policy.record_step(num_rows=4, is_verify=True, seconds=0.05)
        policy.record_step(num_rows=2, is_verify=True, seconds=0.05)
    req.spec.cooldown_steps, req.spec.accepted_weight = 0, 100.0
    req.spec.is_probing = False  # known to be right: it drafts at its acceptance's depth
    policy.plan_step([req])
    assert not policy.is_on
    for _ in range(PROBE_INTERVAL - 2):
        policy.plan_step([req])
    assert not policy.is_on
    policy.plan_step([req])
    assert policy.is_on  # a probe refreshes the verify measurements
    for _ in range(8):  # verifies as fast as plain steps: drafting pays
        policy.record_step(num_rows=4, is_verify=True, seconds=0.01)
    policy.plan_step([req])
    assert policy.is_on


def test_a_failed_probe_after_a_cool_down_cools_down_again_at_once():
    cfg = config(speculative_adaptive=True, max_model_len=256)
    sched = _steady_clock(Scheduler(cfg, num_blocks=128, num_slots=8, vocab_size=100))
    runner = FakeSpecRunner(error_rate=1.0, num_blocks=128)  # every first draft is wrong
    req = sched.add_request("r", [1, 2, 3], SamplingParams(max_tokens=200))
    cooldowns: list[tuple[int, int]] = []  # (the step it started after, its steps)
    verifies_between: list[int] = []
    probe_depths: list[int] = []
    last = 0
    while sched.has_work():
        batch = sched.schedule()
        was_cooling = req.spec.cooldown_steps
        if req.spec.is_probing:
            probe_depths += [s.num_lookahead_tokens for s in batch.seqs if s.num_lookahead_tokens]
        sched.update(batch, runner.run(batch))
        if req.spec.cooldown_steps and not was_cooling:
            cooldowns.append((batch.step_idx, req.spec.cooldown_steps))
            verifies_between.append(req.spec.num_verifies - last)
            last = req.spec.num_verifies
    # Each cool-down doubles (FIRST_COOLDOWN_STEPS on, up to MAX_COOLDOWN_STEPS), lasts at least
    # that long and ends on a step whose index is a multiple of it.
    lengths = [FIRST_COOLDOWN_STEPS << i for i in range(3)] + [MAX_COOLDOWN_STEPS]
    assert len(cooldowns) >= 4
    for (start, steps), length in zip(cooldowns, lengths, strict=False):
        assert length <= steps < 2 * length and (start + steps) % length == 0
    # The first cool-down takes a few rejected verifies; each after it, one (the probe), of one
    # draft.
    assert verifies_between[0] >= 2 and all(n == 1 for n in verifies_between[1:])
    assert probe_depths and set(probe_depths) == {1}


def test_no_leaks_after_a_thousand_random_requests_with_aborts():
    rng = random.Random(3)
    cfg = config(max_num_seqs=8, max_num_batched_tokens=32)
    sched = Scheduler(cfg, num_blocks=48, num_slots=8, vocab_size=100)
    runner = FakeSpecRunner(num_blocks=48, num_slots=8, overlap=True)
    for i in range(1000):
        prompt = [rng.randrange(1, 100) for _ in range(rng.randint(1, 40))]
        sched.add_request(str(i), prompt, SamplingParams(max_tokens=rng.randint(1, 24)))
        for _ in range(rng.randint(0, 3)):
            if sched.has_work():
                batch = sched.schedule()
                sched.update(batch, runner.run(batch))
        if rng.random() < 0.2 and sched._requests:
            sched.abort(rng.choice(sorted(sched._requests)))
    drain(sched, runner)
    stats = sched.stats()
    assert stats.num_aborted > 50 and stats.spec.num_drafts > 100 and stats.num_preemptions > 0
    assert stats.num_finished + stats.num_aborted == 1000
    assert sched.blocks.num_free_blocks == 48 and sched.slots.num_free_slots == 8


def test_a_request_without_drafts_cools_down_and_its_steps_overlap_again():
    class NoDrafts(FakeSpecRunner):
        def run(self, batch: ScheduledBatch) -> ModelOutput:
            out = super().run(batch)
            # The drafter found nothing: one sample per row, no outcome.
            firsts = {}
            for seq, sample in out.samples:
                firsts.setdefault(id(seq), (seq, sample))
            return ModelOutput(samples=tuple(firsts.values()))

    sched = Scheduler(config(speculative_adaptive=True), num_blocks=64, num_slots=8, vocab_size=100)
    _steady_clock(sched)
    runner = NoDrafts()
    req = sched.add_request("r", [1, 2, 3], SamplingParams(max_tokens=60))
    drain(sched, runner)
    assert req.num_output_tokens == 60 and req.spec.num_verifies == 0
    late = runner.batches[-20:]
    assert sum(b.is_read_at_once for b in late) < 10  # mostly cooling down, overlapped


def test_each_request_drafts_as_deep_as_its_own_acceptance_pays_for():
    policy = SpecPolicy(config(speculative_adaptive=True, num_speculative_tokens=4))
    sure, unsure = (Request(i, [1, 2, 3], SamplingParams(), max_len=64) for i in ("s", "u"))
    sure.spec.accepted_weight, sure.spec.rejected_weight = 9.0, 1.0  # a = 0.9
    unsure.spec.accepted_weight, unsure.spec.rejected_weight = 1.0, 1.0  # a = 0.5
    for req in (sure, unsure):
        req.spec.num_verifies = 1  # a first verify drafts num_speculative_tokens
    assert (policy.depth(sure), policy.depth(unsure)) == (4, 2)  # 0.5^3 < MIN_ACCEPTANCE
    fixed = SpecPolicy(config(speculative_adaptive=False, num_speculative_tokens=4))
    assert fixed.depth(unsure) == 4


def _measured_policy() -> SpecPolicy:
    """A policy whose step-time fits price one more verify row at 0.4 of a plain token's time
    with 8 decode rows (plain steps take 1 s, each verify row 0.05 s more)."""
    policy = SpecPolicy(config(speculative_adaptive=True))
    for n in (4, 8, 4, 8):
        policy.record_step(num_rows=n, is_verify=False, seconds=1.0)
    for rows in (8, 16, 24, 32):
        policy.record_step(num_rows=rows, is_verify=True, seconds=1.0 + 0.05 * (rows - 8))
    return policy


def test_a_request_whose_first_draft_is_not_worth_a_verify_row_stops_drafting():
    reqs = [Request(str(i), [1, 2, 3], SamplingParams(), max_len=64) for i in range(8)]
    priced, unpriced = _measured_policy(), SpecPolicy(config(speculative_adaptive=True))
    priced.plan_step(reqs)
    priced.record(reqs[0], SpecOutcome(3, 0))  # acceptance 0.32: above MIN_ACCEPTANCE
    unpriced.record(reqs[1], SpecOutcome(3, 0))
    assert reqs[0].spec.cooldown_steps > 0 and reqs[1].spec.cooldown_steps == 0


def _decode_together(
    sched: Scheduler, runner: FakeSpecRunner, num_requests: int, *, every: int = 0
) -> list[ScheduledBatch]:
    """num_requests requests of 128 new tokens (one arriving every `every` steps, else all at
    once) decoded to the end -> the steps' batches."""
    params = SamplingParams(max_tokens=128, ignore_eos=True)
    arrivals = [i * every for i in range(num_requests)]
    batches: list[ScheduledBatch] = []
    while arrivals or sched.has_work():
        while arrivals and arrivals[0] <= len(batches):
            i = num_requests - len(arrivals)
            sched.add_request(f"{len(batches)}-{i}", [1 + i, 2, 3], params)
            arrivals.pop(0)
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))
        batches.append(batch)
    return batches


def _spec_engine(*, error_rate: float) -> tuple[Scheduler, FakeSpecRunner]:
    cfg = config(
        speculative_adaptive=True, max_model_len=512, max_num_seqs=64, max_num_batched_tokens=512
    )
    sched = Scheduler(cfg, num_blocks=2048, num_slots=80, vocab_size=100)
    runner = FakeSpecRunner(error_rate=error_rate, num_blocks=2048, num_slots=80, overlap=True)
    return _steady_clock(sched), runner


def _steady_clock(sched: Scheduler) -> Scheduler:
    """sched, its decode steps timed from their rows (10 ms, 0.05 ms a row, 1 ms more for a
    verify), not by this machine's clock, so the cost model decides the same every run."""

    def record_step_time(batch: ScheduledBatch, output: ModelOutput) -> None:
        if batch.seqs and all(s.is_decode for s in batch.seqs):
            rows = len(batch.seqs) + sum(o.num_drafts for o in output.spec.values())
            seconds = 0.010 + 0.00005 * rows + (0.001 if output.spec else 0.0)
            sched.spec.record_step(num_rows=rows, is_verify=bool(output.spec), seconds=seconds)

    sched._record_step_time = record_step_time  # type: ignore[method-assign]
    return sched


def _num_verify_steps(batches: list[ScheduledBatch]) -> int:
    return sum(any(s.num_lookahead_tokens for s in b.seqs) for b in batches)


@pytest.mark.parametrize("num_requests", [1, 8, 32, 64])
def test_a_drafter_that_is_never_right_pays_few_verifies(num_requests):
    sched, runner = _spec_engine(error_rate=1.0)
    # A fresh engine: the prior's few rejected verifies, then the aligned one-draft probes.
    first = _decode_together(sched, runner, num_requests)
    assert _num_verify_steps(first) <= 6
    # Once the engine has seen the drafter be wrong, a new request waits for the batch's next
    # probe step: over 128 new tokens, at most 3 verify steps and 6 steps read at once.
    again = _decode_together(sched, runner, num_requests)
    assert _num_verify_steps(again) <= 3
    assert sum(b.is_read_at_once for b in again) <= 6


def test_requests_arriving_apart_probe_in_the_same_steps():
    sched, runner = _spec_engine(error_rate=1.0)
    batches = _decode_together(sched, runner, 32, every=3)  # about 220 steps in all
    verifies = [b.step_idx for b in batches if any(s.num_lookahead_tokens for s in b.seqs)]
    assert len(batches) > 200 and len(verifies) <= 16  # each request probing alone: over 100
    # Once the first rejections are in, every verify is a probe step: the step after one whose
    # index is a multiple of FIRST_COOLDOWN_STEPS (the step before reads the tokens at once).
    assert all(i % FIRST_COOLDOWN_STEPS == 1 for i in verifies if i > FIRST_COOLDOWN_STEPS)


@pytest.mark.parametrize("num_requests", [1, 32])
def test_a_drafter_that_is_right_drafts_at_full_depth_from_its_first_verify(num_requests):
    sched, runner = _spec_engine(error_rate=0.0)
    batches = _decode_together(sched, runner, num_requests)
    for i in range(num_requests):
        decodes = [
            s for b in batches for s in b.seqs if s.is_decode and s.req.request_id == f"0-{i}"
        ]
        # Its prompt step is read at once (it may draft next), so every decode step drafts 3,
        # its first too, but the last ones, short of max_tokens.
        assert not decodes[0].is_input_inflight and decodes[0].num_lookahead_tokens == 3
        assert all(s.num_lookahead_tokens == 3 for s in decodes if s.req.max_len - s.num_tokens > 4)


def test_a_probe_lasts_until_a_request_can_draft_in_it():
    """A probe step whose requests' tokens are still in flight (the step before overlapped) drafts
    nothing; the probe stays on into the next step, which drafts (this one is read at once),
    instead of waiting another PROBE_INTERVAL steps."""
    policy = SpecPolicy(config(speculative_adaptive=True))
    for _ in range(8):  # verifies cost five times a plain step: drafting does not pay
        policy.record_step(num_rows=1, is_verify=False, seconds=0.01)
        policy.record_step(num_rows=2, is_verify=True, seconds=0.05)
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=100), max_len=256)
    req.spec.is_new = False
    req.spec.cooldown_steps, req.spec.accepted_weight, req.spec.is_probing = 0, 100.0, False
    for _ in range(PROBE_INTERVAL - 1):
        policy.plan_step([req])
        assert not policy.is_on
    req.num_inflight_tokens = 1
    policy.plan_step([req])
    assert policy.is_on and policy.num_lookahead(req, 4) == 0  # read at once, no drafts
    req.num_inflight_tokens = 0
    policy.plan_step([req])
    assert policy.is_on and policy.num_lookahead(req, 4) > 0  # the probe drafts
    policy.plan_step([req])
    assert not policy.is_on
