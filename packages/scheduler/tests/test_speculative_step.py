"""Speculative decoding end to end on the tiny random model (CPU, deterministic numerics): the
verify forward, acceptance and the commit of the accepted positions' states give the output of
plain decoding bit for bit."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch
from scheduler_testing import MixedRun, reference_greedy, run_mixed_steps, run_with_random_aborts
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.request import SamplingParams
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.scheduler import Scheduler
from sparkinfer.scheduler.speculative.drafter import TargetStep

NUM_NEW = 12
RNG = random.Random(0)
PROMPTS = [[RNG.randrange(250) for _ in range(RNG.randint(3, 40))] for _ in range(11)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, logprobs=2)


def config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "block_size": 16,
        "max_model_len": 128,
        "max_num_batched_tokens": 128,
        "deterministic": True,
        "speculative": "ngram",
        "speculative_adaptive": False,
        "num_speculative_tokens": 3,
    }
    return SchedulerConfig(**{**base, **kw})  # type: ignore[arg-type]


class ScriptedDrafter:
    """Drafts each request's known continuation with one draft in a few steps made wrong, so
    verifies accept all, some and none of their drafts."""

    needs_hidden = False

    def __init__(self, continuations: dict[tuple[int, ...], list[int]]) -> None:
        self.continuations = continuations
        self.num_proposed = 0
        self.drafted_ids: set[str] = set()  # requests that got drafts
        self.max_drafting = 0  # most requests drafting in one step

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for seq, k in zip(seqs, num_drafts, strict=True):
            req = seq.req
            done = req.num_output_tokens
            drafts = list(self.continuations[tuple(req.token_ids[: req.num_prompt_tokens])])
            drafts = drafts[done : done + k]
            wrong = (7 * done + req.num_prompt_tokens) % (k + 2)
            if wrong < len(drafts):
                drafts[wrong] = (drafts[wrong] + 1) % 250
            self.num_proposed += len(drafts)
            if drafts:
                self.drafted_ids.add(req.request_id)
            out.append(drafts)
        self.max_drafting = max(self.max_drafting, sum(1 for d in out if d))
        return out

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool:
        return False

    def observe(self, step: TargetStep) -> None:
        pass


def generate(
    model: torch.nn.Module,
    cfg: SchedulerConfig,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    drafter: object | None = None,
) -> MixedRun:
    runner = Runner(model, cfg)  # type: ignore[arg-type]
    if drafter is not None:
        runner.speculative.drafter = drafter  # type: ignore[assignment]
    return run_mixed_steps(runner, cfg, prompts, params)


@pytest.fixture(scope="module")
def plain(tiny_model) -> MixedRun:
    """Each prompt alone, no speculation."""
    runs = [generate(tiny_model, config(speculative="off"), [p], [GREEDY]) for p in PROMPTS]
    return MixedRun([r.tokens[0] for r in runs], [r.logprobs[0] for r in runs], 0, 0)


def _scripted(plain: MixedRun, prompts: Sequence[list[int]] = PROMPTS) -> ScriptedDrafter:
    return ScriptedDrafter({tuple(p): t for p, t in zip(prompts, plain.tokens, strict=False)})


@pytest.mark.parametrize("num_others", [0, 1, 10])
def test_greedy_verify_gives_plain_decoding_bit_for_bit(tiny_model, plain, num_others):
    drafter = _scripted(plain)
    n = num_others + 1
    got = generate(tiny_model, config(), PROMPTS[:n], [GREEDY] * n, drafter)
    assert drafter.num_proposed > 0
    assert got.tokens == plain.tokens[:n]
    assert got.logprobs == plain.logprobs[:n]  # values and top-2, bit for bit


def test_more_requests_than_the_old_roll_back_rows_all_verify_bit_for_bit(tiny_model, plain):
    """12 requests drafting together (the roll-back rows allowed 8): every one verifies in the
    same steps, its GDN states committed from the verify's stash, and greedy output and
    logprobs stay plain decoding's bit for bit."""
    prompts = [*PROMPTS, PROMPTS[0]]
    drafter = _scripted(plain)
    got = generate(tiny_model, config(max_num_seqs=12), prompts, [GREEDY] * 12, drafter)
    assert drafter.max_drafting == 12
    assert got.tokens == [*plain.tokens, plain.tokens[0]]
    assert got.logprobs == [*plain.logprobs, plain.logprobs[0]]


def test_the_ngram_drafter_gives_plain_decoding_and_accepts_repetition(tiny_model):
    rng = random.Random(5)
    loops = [[rng.randrange(250) for _ in range(rng.randint(2, 6))] * 8 for _ in range(4)]
    prompts = [*loops, *PROMPTS[:2]]
    params = [replace(GREEDY, max_tokens=24)] * len(prompts)
    off = generate(tiny_model, config(speculative="off", max_model_len=256), prompts, params)
    cfg = config(max_model_len=256)
    runner = Runner(tiny_model, cfg)
    sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots)
    reqs = [
        sched.add_request(str(i), p, sp)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    while sched.has_work():
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))
    assert [r.output_token_ids for r in reqs] == off.tokens
    assert off.tokens[0] == reference_greedy(tiny_model, prompts[0], 24)
    spec = sched.stats().spec
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > 0
    assert sum(spec.accepted_per_position) == spec.num_accepted_tokens


def test_seeded_sampling_gives_the_tokens_it_gives_without_speculation(tiny_model, plain):
    """A drawn token at a verify row uses the seed of its output position, so a seeded
    request's tokens do not depend on speculation; with min_tokens and logit_bias too."""
    params = [
        SamplingParams(temperature=0.8, top_k=40, seed=11, max_tokens=NUM_NEW, logprobs=1),
        SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=NUM_NEW, min_tokens=5),
        SamplingParams(temperature=0.7, seed=5, max_tokens=NUM_NEW, logit_bias=((7, 3.0),)),
        replace(GREEDY, frequency_penalty=1.0),
    ]
    prompts = PROMPTS[:4]
    off = generate(tiny_model, config(speculative="off"), prompts, params)
    # Drafts from the sampled continuation: most of them are accepted.
    drafter = _scripted(off, prompts)
    on = generate(tiny_model, config(), prompts, params, drafter)
    assert drafter.num_proposed > 0
    assert on.tokens == off.tokens and on.logprobs == off.logprobs


def _state_and_kv(runner: Runner, sched: Scheduler, rid: str) -> tuple[int, list[torch.Tensor]]:
    """(tokens in the cache, [every GDN layer's conv and recurrent row, every KV layer's rows
    up to that length]) of one running request."""
    req = sched._requests[rid]
    slot, n = req.state_slot, req.num_computed_tokens
    assert slot is not None
    out: list[torch.Tensor] = []
    for cache in runner.caches.linear.values():
        out += [cache.conv[slot].clone(), cache.recurrent[slot].clone()]
    bs = runner.config.block_size
    rows = torch.tensor([req.block_ids[p // bs] * bs + p % bs for p in range(n)])
    for kv in runner.caches.attention.values():
        out += [kv.k.flatten(0, 1)[rows].clone(), kv.v.flatten(0, 1)[rows].clone()]
    return n, out


def test_roll_back_leaves_the_state_and_kv_of_a_run_without_rejected_drafts(tiny_model, plain):
    """After every step, the request's GDN rows and KV equal, bit for bit, those of the plain
    run when it had the same tokens in its cache."""
    prompt, params = PROMPTS[2], replace(GREEDY, max_tokens=24)
    seen: dict[int, list[torch.Tensor]] = {}
    drafter = _scripted(
        generate(tiny_model, config(speculative="off"), [prompt], [params]), [prompt]
    )
    num_checked = 0
    for speculative in ("off", "ngram"):
        cfg = config(speculative=speculative)
        runner = Runner(tiny_model, cfg)
        runner.speculative.drafter = drafter  # type: ignore[assignment]
        sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots)
        sched.add_request("r", prompt, params)
        while sched.has_work():
            batch = sched.schedule()
            sched.update(batch, runner.run(batch))
            if "r" not in sched._requests:
                break
            n, rows = _state_and_kv(runner, sched, "r")
            if speculative == "off":
                seen[n] = rows
            else:
                assert all(torch.equal(a, b) for a, b in zip(rows, seen[n], strict=True)), n
                num_checked += 1
        assert sched.blocks.num_free_blocks == sched.blocks.num_blocks
    stats = sched.stats().spec
    assert num_checked > 3 and stats.num_accepted_tokens < stats.num_draft_tokens


def test_a_prefix_cache_hit_under_speculation_gives_the_output_without_either(tiny_model):
    """The first request speculates (rejections included) after its prompt is cached; the second
    resumes from that snapshot and speculates too: both get the plain output, and the cached
    snapshot was never written over by a verify."""
    rng = random.Random(1)
    stem = [rng.randrange(250) for _ in range(300)]
    prompts = [stem, [*stem[:270], *(rng.randrange(250) for _ in range(30))]]
    params = replace(GREEDY, max_tokens=10)
    base = {"max_model_len": 512, "max_num_batched_tokens": 512, "prefix_cache_min_tokens": 128}
    refs = [reference_greedy(tiny_model, p, 10) for p in prompts]
    drafter = ScriptedDrafter({tuple(p): r for p, r in zip(prompts, refs, strict=True)})
    for snapshots in (2, 0):
        cfg = config(**base, prefix_cache_snapshots=snapshots)
        runner = Runner(tiny_model, cfg)
        runner.speculative.drafter = drafter  # type: ignore[assignment]
        sched = Scheduler(
            cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots,
            snapshot_rows=runner.snapshot_rows,
        )  # fmt: skip
        tokens = []
        for i, prompt in enumerate(prompts):
            req = sched.add_request(str(i), prompt, params)
            while sched.has_work():
                batch = sched.schedule()
                sched.update(batch, runner.run(batch))
            tokens.append(req.output_token_ids)
        assert tokens == refs
        assert sched.stats().num_prefix_cached_tokens == (256 if snapshots else 0)
        assert sched.stats().spec.num_draft_tokens > sched.stats().spec.num_accepted_tokens > 0


def test_requests_join_and_leave_while_others_speculate(tiny_model, plain):
    """Four sequences at a time, different lengths: requests finish between verifies and new
    ones are admitted (prompt chunks beside verify rows, preemption for blocks). Tokens only:
    chunks cut by a small budget and prompts recomputed after preemption round differently."""
    prompts = PROMPTS[:9]
    rng = random.Random(4)
    lengths = [rng.randint(4, NUM_NEW) for _ in prompts]
    params = [replace(GREEDY, max_tokens=n) for n in lengths]
    cfg = config(max_num_seqs=4, max_num_batched_tokens=24, num_kv_blocks=5)
    got = generate(tiny_model, cfg, prompts, params, _scripted(plain))
    assert got.tokens == [t[:n] for t, n in zip(plain.tokens, lengths, strict=False)]
    assert got.num_preemptions > 0


def test_no_block_or_slot_leaks_after_random_requests_and_aborts(tiny_model, plain):
    rng = random.Random(7)
    cfg = config(max_num_seqs=6, num_kv_blocks=24, prefix_cache_snapshots=0)
    runner = Runner(tiny_model, cfg)
    runner.speculative.drafter = _scripted(plain)  # type: ignore[assignment]
    sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots)

    def add(i: int) -> None:
        sp = replace(GREEDY, max_tokens=rng.randint(1, NUM_NEW))
        sched.add_request(str(i), PROMPTS[rng.randrange(len(PROMPTS))], sp)

    run_with_random_aborts(runner, sched, rng, 24, add)
    stats = sched.stats()
    assert stats.num_aborted > 0 and stats.spec.num_drafts > 0
    assert sched.blocks.num_free_blocks == cfg.num_kv_blocks
    assert sched.slots.num_free_slots == runner.num_slots


class OutOfVocabularyDrafter(ScriptedDrafter):
    """Right drafts, then one outside the vocabulary, then more."""

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        rows = super().propose(seqs, num_drafts)
        return [[*r[:1], 10**6, *r[1:]] if r else [-1] for r in rows]


def test_a_draft_outside_the_vocabulary_cuts_the_drafts_there(tiny_model, plain):
    drafter = OutOfVocabularyDrafter(_scripted(plain).continuations)
    got = generate(tiny_model, config(), PROMPTS[:3], [GREEDY] * 3, drafter)
    assert got.tokens == plain.tokens[:3]


def test_graphed_verify_steps_give_the_eager_steps_tokens(tiny_model, plain, monkeypatch):
    """The verify graphs (captured and replayed on the CPU stand-ins): every row padded to k
    drafts, padding sequences without a state slot, the accepted positions committed after each
    replay; tokens and logprobs stay plain decoding's, among requests that finish and join
    (buckets 1 to 4)."""
    from scheduler_testing import attach_cpu_verify_graphs

    cfg = config(max_num_seqs=4)
    runner = Runner(tiny_model, cfg)
    runner.speculative.drafter = _scripted(plain)  # type: ignore[assignment]
    replays = attach_cpu_verify_graphs(runner, monkeypatch, num_drafts=3)
    lengths = [RNG.randint(2, NUM_NEW) for _ in range(7)]
    params = [replace(GREEDY, max_tokens=n) for n in lengths]
    got = run_mixed_steps(runner, cfg, PROMPTS[:7], params)
    assert 4 in replays.verifies and len(set(replays.verifies)) >= 2  # padded and full buckets
    assert replays.commits == replays.verifies  # each verify's accepted positions committed
    assert got.tokens == [t[:n] for t, n in zip(plain.tokens, lengths, strict=False)]
    assert got.logprobs == [lp[:n] for lp, n in zip(plain.logprobs, lengths, strict=False)]


@pytest.mark.parametrize("is_graphed", [False, True], ids=["eager", "graphs"])
def test_acceptance_on_the_device_keeps_the_rows_the_host_accepts(
    tiny_model, plain, monkeypatch, is_graphed
):
    """The commit follows the draws on the device, its kept rows computed there before the host
    reads the draws (`num_kept_on_device`): each verify's equal what the host's acceptance of
    the same draws gives, over verifies that accept all, some and none of their drafts."""
    from scheduler_testing import attach_cpu_verify_graphs
    from sparkinfer.scheduler.speculative import step as spec_step

    cfg = config(max_num_seqs=4)
    runner = Runner(tiny_model, cfg)
    runner.speculative.drafter = _scripted(plain)  # type: ignore[assignment]
    if is_graphed:
        attach_cpu_verify_graphs(runner, monkeypatch, num_drafts=3)
    on_device: list[tuple[Sequence[ScheduledSeq], int, list[int]]] = []
    on_host: list[spec_step.Accepted] = []
    kept_fn, accept_fn = spec_step.num_kept_on_device, spec_step.accept

    def kept(rows, drafts, index, order, num_seqs, drawn):
        out = kept_fn(rows, drafts, index, order, num_seqs, drawn)
        on_device.append((list(order), num_seqs, out.tolist()))
        return out

    def accept(*args):
        on_host.append(accept_fn(*args))
        return on_host[-1]

    monkeypatch.setattr(spec_step, "num_kept_on_device", kept)
    monkeypatch.setattr(spec_step, "accept", accept)
    got = run_mixed_steps(runner, cfg, PROMPTS[:6], [GREEDY] * 6)
    assert got.tokens == plain.tokens[:6]
    verified = [a for a in on_host if a.outcomes]
    assert len(verified) == len(on_device) > 0
    for accepted, (order, num_seqs, device_kept) in zip(verified, on_device, strict=True):
        assert device_kept == accepted.num_kept(order, num_seqs)
    outcomes = [o for a in verified for o in a.outcomes.values()]
    assert {o.num_accepted == o.num_drafts for o in outcomes} == {True, False}
    assert any(o.num_accepted == 0 for o in outcomes)


@pytest.mark.gpu
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("num_prompts", [5, 12])
def test_verify_on_cuda_gives_plain_decoding_bit_for_bit(enforce_eager, num_prompts):
    """bf16 on the device, Triton kernels, deterministic: verify steps (graphed or eager) with
    drafts right and wrong give the tokens and logprobs of plain decoding, among others; 12
    requests verify together (the roll-back rows allowed 8), their states committed by the
    verify's commit kernels (graphed per bucket)."""
    from scheduler_testing import build_tiny_model, run_together
    from sparkinfer.scheduler.engine import Engine

    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    is_many = num_prompts > 8
    params = SamplingParams(temperature=0.0, max_tokens=48 if is_many else 24, logprobs=0)
    step = 5 if is_many else 37  # short prompts: all of them decode together a while
    prompts = [[(7 * i + 3 * j) % 250 for j in range(20 + step * i)] for i in range(num_prompts)]
    base = config(max_model_len=512, max_num_seqs=max(8, num_prompts), enforce_eager=enforce_eager)
    off = Engine.from_model(model, replace(base, speculative="off"))
    try:
        want = run_together(off, prompts, params)
    finally:
        off.shutdown()
    engine = Engine.from_model(model, base)
    drafter = ScriptedDrafter(
        {tuple(p): [t for t, _ in w] for p, w in zip(prompts, want, strict=True)}
    )
    engine.runner.speculative.drafter = drafter  # type: ignore[attr-defined]
    try:
        got = run_together(engine, prompts, params)
        spec = engine.stats().spec
    finally:
        engine.shutdown()
    assert drafter.num_proposed > 0 and 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    assert drafter.max_drafting > 8 or not is_many  # more than the old roll-back rows held
    assert got == want


class TableDrafter:
    """Drafts the likeliest next tokens after each known output prefix (a fixed table)."""

    needs_hidden = False

    def __init__(self, table: dict[tuple[int, ...], list[int]]) -> None:
        self.table = table
        self.num_proposed = 0

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        pairs = zip(seqs, num_drafts, strict=True)
        out = [self.table.get(tuple(s.req.output_token_ids), [])[:k] for s, k in pairs]
        self.num_proposed += sum(map(len, out))
        return out

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool:
        return False

    def observe(self, step: TargetStep) -> None:
        pass


def test_unseeded_sampled_speculation_keeps_the_target_distribution(tiny_model):
    """Three tokens drawn from the top 3 at temperature 1, unseeded, with drafts of the likeliest
    continuation: the joint frequencies of the 27 outcomes against the exact probabilities
    (chi-square, p = 0.001)."""
    from scheduler_testing import reference_logits

    prompt, num_samples, top_k = PROMPTS[5], 240, 3

    def top(tokens: list[int]) -> tuple[list[int], list[float]]:
        logits = reference_logits(tiny_model, [*prompt, *tokens])[-1]
        values, ids = logits.topk(top_k)
        return ids.tolist(), torch.softmax(values, -1).tolist()

    exact: dict[tuple[int, ...], float] = {}
    table: dict[tuple[int, ...], list[int]] = {}
    ids1, p1 = top([])
    table[()] = [ids1[0]]
    for a, pa in zip(ids1, p1, strict=True):
        ids2, p2 = top([a])
        table[(a,)] = ids2[:1]
        for b, pb in zip(ids2, p2, strict=True):
            ids3, p3 = top([a, b])
            table[(a, b)] = ids3[:1]
            for c, pc in zip(ids3, p3, strict=True):
                exact[(a, b, c)] = pa * pb * pc
    params = SamplingParams(temperature=1.0, top_k=top_k, max_tokens=3)
    cfg = config(max_num_seqs=24, deterministic=False, num_speculative_tokens=2)
    drafter = TableDrafter(table)
    got = generate(tiny_model, cfg, [prompt] * num_samples, [params] * num_samples, drafter)
    assert drafter.num_proposed >= num_samples  # one draft each, after the first token
    counts: dict[tuple[int, ...], int] = {}
    for tokens in got.tokens:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    assert set(counts) <= set(exact)
    # Cells expected under 5 times are pooled into one.
    small = [k for k, p in exact.items() if p * num_samples < 5]
    cells = [([k], p) for k, p in exact.items() if k not in small]
    if small:
        cells.append((small, sum(exact[k] for k in small)))
    chi2 = sum(
        (sum(counts.get(k, 0) for k in keys) - p * num_samples) ** 2 / (p * num_samples)
        for keys, p in cells
        if p > 0
    )
    # chi-square quantiles at p = 0.001 for 1..26 degrees of freedom, from scipy.stats.chi2.ppf
    quantiles = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26,
                 32.91, 34.53, 36.12, 37.70, 39.25, 40.79, 42.31, 43.82, 45.31, 46.80, 48.27,
                 49.73, 51.18, 52.62, 54.05]  # fmt: skip
    assert chi2 < quantiles[len(cells) - 2], (chi2, len(cells))


def _one_in_three(history: Sequence[int], row: torch.Tensor) -> None:
    """A grammar's stand-in: the ids it allows next depend on every token before (a draft
    one off from an allowed token is always refused)."""
    allowed = (sum(history) + torch.arange(row.shape[-1])) % 3 == 0
    row.masked_fill_(~allowed, float("-inf"))


KINDS = [  # every kind of request, each drafting (ScriptedDrafter) beside the others
    replace(GREEDY, presence_penalty=1.5),
    SamplingParams(temperature=0.9, seed=4, max_tokens=NUM_NEW, frequency_penalty=0.7, logprobs=1),
    replace(GREEDY, repetition_penalty=1.3),
    replace(GREEDY, logit_bias=((5, 4.0), (9, 2.5))),
    SamplingParams(temperature=0.8, seed=2, max_tokens=NUM_NEW, logprobs=3),
    replace(GREEDY, logits_processor=_one_in_three),
    SamplingParams(temperature=0.7, seed=8, max_tokens=NUM_NEW, logits_processor=_one_in_three),
]


@pytest.fixture(scope="module")
def kinds_off(tiny_model) -> MixedRun:
    return generate(tiny_model, config(speculative="off"), PROMPTS[: len(KINDS)], KINDS)


def test_every_request_kind_speculates_and_keeps_its_output_as_requests_join(tiny_model, kinds_off):
    """Penalties, logit bias, logprobs and a grammar's mask: each verify row draws as a
    one-token step would (the drafts before it counted and masked as outputs), so tokens and
    logprobs are those without speculation, bit for bit; three at a time, so requests join
    mid-speculation."""
    prompts = PROMPTS[: len(KINDS)]
    lengths = [NUM_NEW - (i % 3) * 3 for i in range(len(KINDS))]
    params = [replace(sp, max_tokens=n) for sp, n in zip(KINDS, lengths, strict=True)]
    drafter = _scripted(kinds_off, prompts)
    on = generate(tiny_model, config(max_num_seqs=3), prompts, params, drafter)
    assert drafter.drafted_ids == {str(i) for i in range(len(KINDS))}
    assert on.tokens == [t[:n] for t, n in zip(kinds_off.tokens, lengths, strict=True)]
    assert on.logprobs == [lp[:n] for lp, n in zip(kinds_off.logprobs, lengths, strict=True)]
    for tokens in (on.tokens[5], on.tokens[6]):  # the mask held at every accepted draft
        assert all((sum(tokens[:i]) + t) % 3 == 0 for i, t in enumerate(tokens) if i)


def test_every_request_kind_keeps_its_output_across_aborts(tiny_model, kinds_off):
    """Requests of every kind arrive and are aborted at random between steps: each one that
    finishes got the output it gets without speculation, and nothing leaks."""
    rng = random.Random(11)
    cfg = config(max_num_seqs=4, num_kv_blocks=24, prefix_cache_snapshots=0)
    runner = Runner(tiny_model, cfg)
    runner.speculative.drafter = _scripted(kinds_off, PROMPTS[: len(KINDS)])  # type: ignore[assignment]
    sched = Scheduler(cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots)
    reqs = []

    def add(i: int) -> None:
        kind, n = i % len(KINDS), rng.randint(1, NUM_NEW)
        reqs.append(
            (kind, sched.add_request(str(i), PROMPTS[kind], replace(KINDS[kind], max_tokens=n)))
        )

    run_with_random_aborts(runner, sched, rng, 21, add)
    for kind, req in reqs:  # an aborted request's tokens are a prefix of the plain output too
        assert req.output_token_ids == kinds_off.tokens[kind][: len(req.output_token_ids)]
    stats = sched.stats()
    assert stats.num_aborted > 0 and stats.spec.num_accepted_tokens > 0
    assert sched.blocks.num_free_blocks == cfg.num_kv_blocks
    assert sched.slots.num_free_slots == runner.num_slots


def test_every_request_kind_keeps_its_output_after_a_prefix_cache_hit(tiny_model):
    """Requests of several kinds share a cached prompt prefix and speculate after resuming from
    its snapshot: each gets the output of plain decoding without a prefix cache."""
    rng = random.Random(2)
    stem = [rng.randrange(250) for _ in range(300)]
    prompts = [
        stem,
        *([*stem[:270], *(rng.randrange(250) for _ in range(20 + i))] for i in range(2)),
    ]
    params = [replace(KINDS[5], max_tokens=10), replace(KINDS[2], max_tokens=10), KINDS[1]]
    base = {"max_model_len": 512, "max_num_batched_tokens": 512, "prefix_cache_min_tokens": 128}
    off = generate(
        tiny_model, config(**base, speculative="off", prefix_cache_snapshots=0), prompts, params
    )
    cfg = config(**base, prefix_cache_snapshots=2)
    runner = Runner(tiny_model, cfg)
    runner.speculative.drafter = _scripted(off, prompts)  # type: ignore[assignment]
    sched = Scheduler(
        cfg, num_blocks=runner.num_blocks, num_slots=runner.num_slots,
        snapshot_rows=runner.snapshot_rows,
    )  # fmt: skip
    tokens = []
    for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
        req = sched.add_request(str(i), prompt, sp)
        while sched.has_work():
            batch = sched.schedule()
            sched.update(batch, runner.run(batch))
        tokens.append(req.output_token_ids)
    assert tokens == off.tokens
    assert sched.stats().num_prefix_cached_tokens == 2 * 256
    assert sched.stats().spec.num_draft_tokens > sched.stats().spec.num_accepted_tokens > 0
