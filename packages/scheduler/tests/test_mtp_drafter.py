"""The MTP drafter on the tiny random model with a random MTP head (CPU, deterministic): the
output is plain decoding's, and every draft is the one a plain forward of the head over the whole
sequence gives (its KV kept across chunks, verifies and rejections); on FP8 weights too."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from scheduler_testing import (
    CpuGraph,
    CpuStream,
    MixedRun,
    attach_cpu_graphs,
    build_tiny_model,
    record_proposals,
    run_mixed_steps,
    use_cpu_graph_standins,
)
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.mtp import MTPHead
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.observer import StepObserver, StepSpan
from sparkinfer.scheduler.request import SamplingParams
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.sampler import Sampler
from sparkinfer.scheduler.speculative.drafter import Drafts, TargetStep
from sparkinfer.scheduler.speculative.mtp_drafter import MAX_PENDING_ROWS, MTPDrafter

RNG = random.Random(3)
PROMPTS = [[RNG.randrange(250) for _ in range(RNG.randint(3, 40))] for _ in range(6)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, logprobs=1)


@pytest.fixture(scope="module")
def mtp_model() -> Qwen3_8ForCausalLM:
    return _with_mtp_head(build_tiny_model(seed=0))


def _with_mtp_head(model: Qwen3_8ForCausalLM) -> Qwen3_8ForCausalLM:
    head = MTPHead(model.config.text, ops=model.ops, device=torch.device("cpu"), dtype=model.dtype)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, p in head.named_parameters():
            scale = 0.1 if "norm" in name else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    model.mtp = head.eval()
    return model


def config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "block_size": 16, "max_model_len": 128, "max_num_batched_tokens": 128,
        "deterministic": True, "speculative": "mtp", "speculative_adaptive": False,
    }  # fmt: skip
    return SchedulerConfig(**{**base, **kw})  # type: ignore[arg-type]


class RecordingDrafter(MTPDrafter):
    """Records (tokens so far, drafts) of every proposal."""

    proposals: list[tuple[list[int], list[int]]]

    def propose_drafts(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> Drafts:
        drafts = super().propose_drafts(seqs, num_drafts)
        record_proposals(self.proposals, seqs, drafts.host())  # the ids still feed the verify
        return drafts


class ThrottledDrafter(RecordingDrafter):
    """Asks for fewer drafts than allowed, by a pattern over calls and rows: none at all for
    whole stretches (the head falls behind and catches up), else 1 to k (rows of one step
    drafting different counts)."""

    num_calls = 0
    is_silent = False  # never draft

    def propose_drafts(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> Drafts:
        self.num_calls += 1
        c = self.num_calls
        wanted = [
            0 if self.is_silent or (c // 5 + i) % 3 == 0 else min(k, 1 + (c + i) % 3)
            for i, k in enumerate(num_drafts)
        ]
        return super().propose_drafts(seqs, wanted)


class CountingHead(torch.nn.Module):
    """The head, counting the rows of each call."""

    def __init__(self, head: MTPHead) -> None:
        super().__init__()
        self.inner = head
        self.calls: list[int] = []

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, batch: ForwardBatch) -> object:
        self.calls.append(embeds.shape[0])
        return self.inner(embeds, hidden, batch)


def _recording_runner(
    model: Qwen3_8ForCausalLM,
    cfg: SchedulerConfig,
    kind: type[RecordingDrafter] = RecordingDrafter,
    observer: StepObserver | None = None,
) -> Runner:
    runner = Runner(model, cfg, observer=observer)
    assert model.mtp is not None
    drafter = kind(
        model, model.mtp, runner.caches, block_size=cfg.block_size, device=runner.device,
        draft_vocab=cfg.speculative_draft_vocab,
    )  # fmt: skip
    drafter.proposals = []
    runner.speculative.drafter = drafter
    return runner


@pytest.fixture(scope="module")
def plain(mtp_model) -> tuple[MixedRun, list[MixedRun]]:
    """Every prompt together, and the first two alone, without speculation."""
    off = config(speculative="off")
    together = run_mixed_steps(Runner(mtp_model, off), off, PROMPTS, [GREEDY] * len(PROMPTS))
    alone = [run_mixed_steps(Runner(mtp_model, off), off, [p], [GREEDY]) for p in PROMPTS[:2]]
    return together, alone


@pytest.mark.parametrize("num_drafts", [1, 3])
def test_mtp_speculation_gives_plain_decoding_bit_for_bit(mtp_model, plain, num_drafts):
    off, alone = plain
    cfg = config(num_speculative_tokens=num_drafts, max_num_batched_tokens=48)
    runner = _recording_runner(mtp_model, cfg)
    on = run_mixed_steps(runner, cfg, PROMPTS, [GREEDY] * len(PROMPTS))
    assert on.tokens == off.tokens
    assert on.tokens[:2] == [a.tokens[0] for a in alone]
    assert on.logprobs[:2] == [a.logprobs[0] for a in alone]
    drafter = runner.speculative.drafter
    assert isinstance(drafter, RecordingDrafter) and drafter.proposals
    assert max(len(d) for _, d in drafter.proposals) == num_drafts


def _assert_heads_drafts(
    model: Qwen3_8ForCausalLM, proposals: list[tuple[list[int], list[int]]]
) -> None:
    """Nearly every proposal equals the head's drafts from plain forwards (rounding may flip a
    near tie, rarely)."""
    same = [drafts == _reference_drafts(model, tokens, len(drafts)) for tokens, drafts in proposals]
    assert sum(same) >= 0.9 * len(same), same


def _reference_drafts(model: Qwen3_8ForCausalLM, tokens: list[int], k: int) -> list[int]:
    """Drafts after `tokens` from plain forwards on fresh caches: the target over every token,
    the head over every (next token, hidden) pair in one prefill, then k - 1 head rows."""
    head = model.mtp
    assert head is not None
    bs, n = 16, len(tokens)
    spec = model.cache_spec()
    num_blocks = -(-(n + k) // bs)
    caches = allocate_caches(spec, num_blocks=num_blocks, block_size=bs, num_slots=1, device="cpu")
    table = list(range(num_blocks))

    def batch(num: int, cached: int) -> ForwardBatch:
        positions = torch.arange(cached + 1, cached + 1 + num)
        return ForwardBatch.build(
            [num], [cached], [table], [0], caches=caches, block_size=bs, device="cpu",
            positions=positions,
        )  # fmt: skip

    with torch.inference_mode():
        target = ForwardBatch.build(
            [n], [0], [table], [0], caches=caches, block_size=bs, device="cpu"
        )
        hidden = model(torch.tensor(tokens), target)
        # Pairs (t_{p+1}, H_p) for p = 0 .. n - 2; the last one (t_n, H_{n-1}) drafts t_{n+1}.
        embeds = model.embed_input_ids(torch.tensor(tokens[1:]))
        out = head(embeds, hidden[:-1], batch(n - 1, 0))
        # The last row pairs the latest token with the hidden state before it: index n - 2.
        h = out[-1:]
        drafts = [int(model.compute_logits(h).argmax(-1))]
        for j in range(1, k):
            e = model.embed_input_ids(torch.tensor(drafts[-1:]))
            h = head(e, h, batch(1, n - 2 + j))
            drafts.append(int(model.compute_logits(h).argmax(-1)))
    return drafts


def test_every_draft_is_the_one_a_plain_forward_of_the_head_gives(mtp_model):
    cfg = config(num_speculative_tokens=3, max_num_batched_tokens=20)  # prompts in chunks
    runner = _recording_runner(mtp_model, cfg)
    params = [replace(GREEDY, max_tokens=14)] * 3
    run_mixed_steps(runner, cfg, PROMPTS[:3], params)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, RecordingDrafter)
    assert len(drafter.proposals) > 5
    _assert_heads_drafts(mtp_model, drafter.proposals)


def test_drafts_after_stretches_without_drafting_are_the_head_forwards(
    mtp_model, plain, monkeypatch
):
    """Rows that do not draft leave the head behind; it catches up when they draft again, and
    rows of one step drafting 1 to k drafts write only their own KV. Plain steps replay the
    decode graphs (with their hidden states) on the CPU stand-ins."""
    cfg = config(num_speculative_tokens=3, max_num_batched_tokens=20)
    runner = _recording_runner(mtp_model, cfg, ThrottledDrafter)
    replayed = attach_cpu_graphs(runner, monkeypatch)
    params = [replace(GREEDY, max_tokens=14)] * 3
    on = run_mixed_steps(runner, cfg, PROMPTS[:3], params)
    off = config(speculative="off", max_num_batched_tokens=20)
    want = run_mixed_steps(Runner(mtp_model, off), off, PROMPTS[:3], params)
    assert on.tokens == want.tokens
    assert replayed, "no plain decode step replayed a graph"
    drafter = runner.speculative.drafter
    assert isinstance(drafter, ThrottledDrafter)
    assert {len(d) for _, d in drafter.proposals} == {1, 2, 3}
    _assert_heads_drafts(mtp_model, drafter.proposals)


class WrongDrafter(RecordingDrafter):
    """Records the head's drafts, then proposes each one wrong (every verify rejects)."""

    def propose_drafts(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> Drafts:
        drafts = super().propose_drafts(seqs, num_drafts)
        if drafts.ids is None:
            return Drafts.on_host([[(t + 1) % 250 for t in d] for d in drafts.host()])
        return Drafts(drafts.counts, ids=(drafts.ids + 1) % 250, rows=drafts.rows)


def test_plain_steps_overlap_while_no_request_drafts_and_the_head_still_sees_them(
    mtp_model, monkeypatch
):
    """With every draft rejected, requests cool down and their plain decode steps overlap the
    next (not read at once); the head takes those rows on the device, so a request's drafts
    after a cool-down are still the head's plain-forward drafts."""
    cfg = config(num_speculative_tokens=2, speculative_adaptive=True, max_num_batched_tokens=20)
    runner = _recording_runner(mtp_model, cfg, WrongDrafter)
    attach_cpu_graphs(runner, monkeypatch)
    in_flight: list[int] = []
    observe = runner.speculative.observe_in_flight
    monkeypatch.setattr(
        runner.speculative,
        "observe_in_flight",
        lambda seqs, h, ids: (in_flight.append(len(seqs)), observe(seqs, h, ids)),
    )
    read_at_once: list[bool] = []
    run = runner.run
    monkeypatch.setattr(
        runner, "run", lambda b: (read_at_once.append(b.is_read_at_once), run(b))[1]
    )
    params = [replace(GREEDY, max_tokens=40)] * 2
    on = run_mixed_steps(runner, cfg, PROMPTS[:2], params)
    off = config(speculative="off", max_num_batched_tokens=20)
    assert on.tokens == run_mixed_steps(Runner(mtp_model, off), off, PROMPTS[:2], params).tokens
    assert in_flight and not all(read_at_once), "no plain decode step overlapped the next"
    drafter = runner.speculative.drafter
    assert isinstance(drafter, WrongDrafter) and len(drafter.proposals) > 4
    _assert_heads_drafts(mtp_model, drafter.proposals)


class LoggingObserver:
    """Logs where each span begins and ends, and the stream each was given."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.streams: list[tuple[StepSpan, object]] = []

    @contextlib.contextmanager
    def span(self, kind: StepSpan, stream: torch.cuda.Stream | None) -> Iterator[None]:
        self.log.append(f"{kind} begins")
        self.streams.append((kind, stream))
        yield
        self.log.append(f"{kind} ends")


class LoggedDrafter(WrongDrafter):
    """Logs each call of propose and observe."""

    log: list[str]

    def propose_drafts(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> Drafts:
        self.log.append("propose")
        return super().propose_drafts(seqs, num_drafts)

    def observe(self, step: TargetStep) -> None:
        self.log.append("observe")
        super().observe(step)


def test_a_step_observer_brackets_each_graph_replay_and_drafter_call_once(mtp_model, monkeypatch):
    """Every decode-graph replay and every call of the drafter (its observe of steps read at
    once and of steps in flight) is one span; the tokens are those of the unobserved engine."""
    cfg = config(num_speculative_tokens=2, speculative_adaptive=True, max_num_batched_tokens=20)
    params = [replace(GREEDY, max_tokens=40)] * 2
    log: list[str] = []
    observer = LoggingObserver(log)
    runner = _recording_runner(mtp_model, cfg, LoggedDrafter, observer=observer)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, LoggedDrafter) and runner.speculative.observer is observer
    drafter.log = log
    replayed = attach_cpu_graphs(runner, monkeypatch)
    on = run_mixed_steps(runner, cfg, PROMPTS[:2], params)

    calls = [e for e in log if e in ("propose", "observe")]
    assert calls.count("propose") > 4 and calls.count("observe") > 4
    spans = [e for e in log if not e.startswith("decode_replay")]
    assert spans == [e for c in calls for e in (f"draft_{c} begins", c, f"draft_{c} ends")]
    replays = [e for e in log if e.startswith("decode_replay")]
    assert replays == ["decode_replay begins", "decode_replay ends"] * len(replayed)
    assert replayed, "no plain decode step replayed a graph"
    assert all((s is None) == (k != "decode_replay") for k, s in observer.streams)  # CPU

    unobserved = _recording_runner(mtp_model, cfg, WrongDrafter)
    assert unobserved.observer is None
    attach_cpu_graphs(unobserved, monkeypatch)
    assert on.tokens == run_mixed_steps(unobserved, cfg, PROMPTS[:2], params).tokens


def test_an_engines_observer_sees_its_drafter(mtp_model):
    log: list[str] = []
    engine = Engine.from_model(mtp_model, config(), observer=LoggingObserver(log))
    try:
        engine.generate(PROMPTS[0], GREEDY)
    finally:
        engine.shutdown()
    assert log.count("draft_propose begins") == log.count("draft_propose ends") > 0


def _attach_cpu_head_graphs(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Capture the head's graphs on the CPU stand-ins; returns the list of replayed buckets."""
    drafter = runner.speculative.drafter
    assert isinstance(drafter, MTPDrafter)
    use_cpu_graph_standins(monkeypatch, CpuStream())
    drafter.capture_graphs(
        batch_sizes=(1, 2, 4, 8),
        num_drafts=runner.config.num_speculative_tokens,
        max_blocks_per_seq=runner.config.max_blocks_per_seq,
        stream=CpuStream(),  # type: ignore[arg-type]
    )
    graphs = drafter.graphs
    assert graphs is not None
    replayed: list[int] = []
    for size, captured in graphs.buckets.captured.items():

        def rerun(size: int = size, output: torch.Tensor = captured.output) -> None:
            replayed.append(size)
            output.copy_(graphs._forward(size))

        assert isinstance(captured.graph, CpuGraph)
        captured.graph.rerun = rerun
    return replayed


@pytest.mark.parametrize("kind", [RecordingDrafter, ThrottledDrafter])
def test_head_graphs_give_the_head_forwards_drafts(mtp_model, monkeypatch, kind):
    """The head's catch-up rows (as decode rows of their own) and draft steps replayed from a
    graph give the drafts plain forwards give; steps the graphs do not hold run eagerly."""
    cfg = config(num_speculative_tokens=3, max_num_batched_tokens=20)
    runner = _recording_runner(mtp_model, cfg, kind)
    replayed = _attach_cpu_head_graphs(runner, monkeypatch)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, RecordingDrafter)
    trimmed: list[int] = []
    catch_up_older = drafter._catch_up_older
    monkeypatch.setattr(
        drafter,
        "_catch_up_older",
        lambda seqs, keep: (trimmed.append(len(seqs)), catch_up_older(seqs, keep=keep)),
    )
    params = [replace(GREEDY, max_tokens=24)] * 2
    on = run_mixed_steps(runner, cfg, PROMPTS[:2], params)
    off = config(speculative="off", max_num_batched_tokens=20)
    assert on.tokens == run_mixed_steps(Runner(mtp_model, off), off, PROMPTS[:2], params).tokens
    assert replayed, "no step replayed a head graph"
    # Rows kept while a request did not draft run eagerly first; its drafts still replay.
    assert bool(trimmed) == (kind is ThrottledDrafter)
    assert len(drafter.proposals) > 5
    _assert_heads_drafts(mtp_model, drafter.proposals)


def test_drafts_feed_the_verify_graph_on_the_device_and_are_read_after_the_draws(
    mtp_model, plain, monkeypatch
):
    """The head graph's drafts stay on the device: the verify graph takes them as its input ids
    there, and the host reads them only after the step's draws (the wait that sat between the
    drafts and the verify); tokens and logprobs stay plain decoding's."""
    from scheduler_testing import attach_cpu_verify_graphs

    off, _ = plain
    cfg = config(num_speculative_tokens=3, max_num_batched_tokens=48)
    runner = Runner(mtp_model, cfg)
    head_replays = _attach_cpu_head_graphs(runner, monkeypatch)
    verify = attach_cpu_verify_graphs(runner, monkeypatch, num_drafts=3)
    graphs = runner.verify_graphs
    assert graphs is not None
    log: list[str] = []
    run, host, draw = graphs.run, Drafts.host, Sampler.draw
    drafter = runner.speculative.drafter
    assert isinstance(drafter, MTPDrafter)
    propose = drafter.propose_drafts

    def logged_propose(seqs, num_drafts):
        log.append("propose")
        return propose(seqs, num_drafts)

    def logged_run(seqs, drafts, *args):
        log.append("verify on device" if drafts.is_on_device else "verify from host")
        return run(seqs, drafts, *args)

    def logged_host(drafts: Drafts) -> list[list[int]]:
        if drafts.is_on_device:
            log.append("read drafts")
        return host(drafts)

    def logged_draw(sampler: Sampler, *args, **kw):
        log.append("draw")
        return draw(sampler, *args, **kw)

    monkeypatch.setattr(drafter, "propose_drafts", logged_propose)
    monkeypatch.setattr(graphs, "run", logged_run)
    monkeypatch.setattr(Drafts, "host", logged_host)
    monkeypatch.setattr(Sampler, "draw", logged_draw)
    on = run_mixed_steps(runner, cfg, PROMPTS, [GREEDY] * len(PROMPTS))
    assert on.tokens == off.tokens and on.logprobs == off.logprobs
    assert head_replays and verify.verifies and verify.commits == verify.verifies
    assert log.count("verify on device") == len(verify.verifies)
    assert "read drafts" in log
    drawn = True  # no proposal since the last draw
    for event in log:
        if event == "propose":
            drawn = False
        elif event == "draw":
            drawn = True
        elif event == "read drafts":
            assert drawn, f"drafts read on the host before the step's draws: {log}"


def _one_in_three(history: Sequence[int], row: torch.Tensor) -> None:
    """A grammar's stand-in: the ids it allows next depend on every token before."""
    allowed = (sum(history) + torch.arange(row.shape[-1])) % 3 == 0
    row.masked_fill_(~allowed, float("-inf"))


def test_requests_that_read_their_drafts_before_the_draw_keep_their_output(mtp_model, monkeypatch):
    """Penalties and a logits processor take a verify row's drafts before it as outputs, so
    they read drafts left on the device before the draw; seeded sampling beside them. Tokens
    and logprobs are those without speculation."""
    from scheduler_testing import attach_cpu_verify_graphs

    kinds = [
        replace(GREEDY, presence_penalty=1.5),
        SamplingParams(temperature=0.9, seed=4, max_tokens=10, frequency_penalty=0.7, logprobs=1),
        replace(GREEDY, repetition_penalty=1.3),
        replace(GREEDY, logits_processor=_one_in_three),
        SamplingParams(temperature=0.8, seed=2, max_tokens=10, logprobs=2),
    ]
    prompts = PROMPTS[: len(kinds)]
    cfg = config(num_speculative_tokens=3, max_num_batched_tokens=48)
    runner = Runner(mtp_model, cfg)
    _attach_cpu_head_graphs(runner, monkeypatch)
    verify = attach_cpu_verify_graphs(runner, monkeypatch, num_drafts=3)
    on = run_mixed_steps(runner, cfg, prompts, kinds)
    off = config(speculative="off", max_num_batched_tokens=48)
    want = run_mixed_steps(Runner(mtp_model, off), off, prompts, kinds)
    assert verify.verifies
    assert on.tokens == want.tokens
    # Past each prompt's token: that one's logprob may differ in its last bit from the plain
    # run's (a prompt step's lm_head over every row, for the head), drafts or not.
    assert [lp[1:] for lp in on.logprobs] == [lp[1:] for lp in want.logprobs]


def test_a_failed_head_capture_leaves_the_eager_head(mtp_model, monkeypatch):
    runner = Runner(mtp_model, config())
    runner.verify_graphs = SimpleNamespace(batch_sizes=(1,), num_drafts=3, stream=CpuStream())  # type: ignore[assignment]
    drafter = runner.speculative.drafter
    assert isinstance(drafter, MTPDrafter)

    def fail(**kw: object) -> None:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(drafter, "capture_graphs", fail)
    runner.speculative.capture_graphs()
    assert drafter.graphs is None


def test_a_head_that_never_drafts_runs_only_over_prompts(mtp_model):
    """No request drafts: the head runs over the prompt chunks and never per decode step."""
    cfg = config(num_speculative_tokens=3)
    runner = _recording_runner(mtp_model, cfg, ThrottledDrafter)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, ThrottledDrafter)
    drafter.is_silent = True
    head = CountingHead(drafter.head)
    drafter.head = head  # type: ignore[assignment]
    run_mixed_steps(runner, cfg, PROMPTS[:3], [GREEDY] * 3)
    assert not drafter.proposals
    assert head.calls and sum(head.calls) == sum(len(p) for p in PROMPTS[:3])


@pytest.mark.gpu
def test_mtp_speculation_on_cuda_gives_plain_decoding_bit_for_bit():
    """bf16 on the device, the head on the Triton kernels, verify steps graphed."""
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    head = MTPHead(model.config.text, ops=model.ops, device=torch.device("cuda"), dtype=model.dtype)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, p in head.named_parameters():
            scale = 0.1 if "norm" in name else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    model.mtp = head.eval()
    cfg = config(max_model_len=256)
    off = replace(cfg, speculative="off")
    want = run_mixed_steps(Runner(model, off), off, PROMPTS, [GREEDY] * len(PROMPTS))
    got = run_mixed_steps(Runner(model, cfg), cfg, PROMPTS, [GREEDY] * len(PROMPTS))
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


@pytest.mark.gpu
def test_adaptive_mtp_on_cuda_gives_plain_decoding_bit_for_bit():
    """A random head's drafts are rejected, so the adaptive policy turns drafting off: plain
    steps replay the decode graphs, the head catches up when a request probes again."""
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    head = MTPHead(model.config.text, ops=model.ops, device=torch.device("cuda"), dtype=model.dtype)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, p in head.named_parameters():
            scale = 0.1 if "norm" in name else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    model.mtp = head.eval()
    cfg = config(max_model_len=256, speculative_adaptive=True)
    params = [replace(GREEDY, max_tokens=60)] * len(PROMPTS)
    off = replace(cfg, speculative="off")
    want = run_mixed_steps(Runner(model, off), off, PROMPTS, params)
    runner = Runner(model, cfg)
    assert runner.graphs is not None
    got = run_mixed_steps(runner, cfg, PROMPTS, params)
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


def test_start_up_warms_the_lm_head_and_the_head_at_every_row_count(mtp_model, monkeypatch):
    """The lm_head runs after a verify replay on the rows that count, and the head catches up
    eagerly over a request's kept rows: start-up runs each once at every row count they can
    take, so no step builds a kernel variant of either."""
    cfg = config(num_speculative_tokens=3, max_num_seqs=2)
    runner = Runner(mtp_model, cfg)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, MTPDrafter)
    rows: list[int] = []
    logits = mtp_model.compute_logits
    monkeypatch.setattr(
        mtp_model, "compute_logits", lambda h: (rows.append(h.shape[0]), logits(h))[1]
    )
    head = CountingHead(drafter.head)
    drafter.head = head  # type: ignore[assignment]
    runner.speculative.warm_up()
    # Verify rows (2 requests, 4 rows each: the verify stash's rows), then the drafts' logits of
    # the eager path.
    assert rows == [*range(1, 2 * 4 + 1), *range(1, 2 + 1)]
    assert head.calls == list(range(1, MAX_PENDING_ROWS + 4 + 1))


def test_a_draft_vocabulary_keeps_drafts_among_its_ids_and_output_unchanged(mtp_model):
    """speculative_draft_vocab N: every draft is an id below N (the argmax over the lm_head's
    first N rows), and greedy output is the same as without speculation."""
    cfg = config(num_speculative_tokens=3, speculative_draft_vocab=100)
    runner = _recording_runner(mtp_model, cfg)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, RecordingDrafter) and drafter.draft_vocab == 100
    hidden = torch.randn(3, mtp_model.config.text.hidden_size)
    full = mtp_model.compute_logits(hidden)
    # A product over the lm_head's first 100 rows: a matmul of another shape, rounded its own way.
    torch.testing.assert_close(drafter.draft_logits(hidden), full[:, :100])
    params = [replace(GREEDY, max_tokens=12)] * 2
    on = run_mixed_steps(runner, cfg, PROMPTS[:2], params)
    off = config(speculative="off")
    assert on.tokens == run_mixed_steps(Runner(mtp_model, off), off, PROMPTS[:2], params).tokens
    assert drafter.proposals and all(t < 100 for _, d in drafter.proposals for t in d)


DEFAULT_DRAFT_VOCAB = SchedulerConfig().speculative_draft_vocab


def test_the_default_draft_vocabulary_is_whole_below_its_size(mtp_model):
    """The default slice (65,536 ids) is larger than the tiny model's 256: its drafts take the
    whole vocabulary, as 0 does."""
    assert DEFAULT_DRAFT_VOCAB == 65_536
    drafter = _recording_runner(mtp_model, config()).speculative.drafter
    assert isinstance(drafter, MTPDrafter) and drafter.draft_vocab == 0
    hidden = torch.randn(2, mtp_model.config.text.hidden_size)
    assert torch.equal(drafter.draft_logits(hidden), mtp_model.compute_logits(hidden))


@pytest.fixture(scope="module")
def wide_mtp_model() -> Qwen3_8ForCausalLM:
    """The tiny model over a vocabulary 64 ids wider than the default draft vocabulary, every id
    real, the lm_head's rows past the slice scaled up so that greedy decoding often picks them."""
    vocab = DEFAULT_DRAFT_VOCAB + 64
    model = build_tiny_model(seed=0, overrides={"vocab_size": vocab})
    model.lm_head.num_real_tokens = vocab
    with torch.no_grad():
        model.lm_head.weight[DEFAULT_DRAFT_VOCAB:] *= 4.0
    return _with_mtp_head(model)


def test_the_default_draft_vocabulary_slices_a_larger_one_and_keeps_output(wide_mtp_model):
    """Over a vocabulary larger than the default, drafts come from its first 65,536 ids only, by
    one product over a view of those lm_head rows (no copy), and greedy output is plain
    decoding's, its tokens past the slice included (their drafts are never proposed)."""
    model = wide_mtp_model
    cfg = config(num_speculative_tokens=3)
    runner = _recording_runner(model, cfg)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, RecordingDrafter) and drafter.draft_vocab == DEFAULT_DRAFT_VOCAB

    weights: list[torch.Tensor] = []

    def spy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        weights.append(w)
        return torch.nn.functional.linear(x, w)

    lm_head = model.lm_head
    plain_ops = lm_head.ops
    lm_head.ops = replace(plain_ops, linear=spy)
    try:
        drafter.draft_logits(torch.randn(2, model.config.text.hidden_size))
    finally:
        lm_head.ops = plain_ops
    [w] = weights
    assert w.shape[0] == DEFAULT_DRAFT_VOCAB and w.is_contiguous()
    assert w.data_ptr() == lm_head.weight.data_ptr()  # a view of the first rows, read in place

    params = [replace(GREEDY, max_tokens=12)] * 3
    on = run_mixed_steps(runner, cfg, PROMPTS[:3], params)
    off = config(speculative="off")
    assert on.tokens == run_mixed_steps(Runner(model, off), off, PROMPTS[:3], params).tokens
    assert drafter.proposals
    assert all(t < DEFAULT_DRAFT_VOCAB for _, d in drafter.proposals for t in d)
    assert any(t >= DEFAULT_DRAFT_VOCAB for row in on.tokens for t in row)  # the slice mattered


def test_auto_drafts_with_the_mtp_head_and_says_so(mtp_model, caplog):
    cfg = config(speculative="auto")
    with caplog.at_level(logging.INFO, logger="sparkinfer.scheduler.runner"):
        engine = Engine.from_model(mtp_model, cfg)
    try:
        assert engine.scheduler.config.speculative == "mtp"  # the scheduler drafts too
        assert isinstance(engine.runner.speculative.drafter, MTPDrafter)  # type: ignore[attr-defined]
        assert "speculative auto: the checkpoint's MTP head drafts up to 3" in caplog.text
    finally:
        engine.shutdown()


def test_auto_decodes_plainly_without_an_mtp_head_and_says_so(tiny_model, caplog):
    with caplog.at_level(logging.INFO, logger="sparkinfer.scheduler.runner"):
        runner = Runner(tiny_model, config(speculative="auto"))
    assert runner.config.speculative == "off" and runner.speculative.drafter is None
    assert "speculative auto: plain decoding (the checkpoint has no MTP head)" in caplog.text


# head_dim 64: every fused part but the last a whole 128 rows (k_proj 128), so every decoder
# projection can be FP8 (Qwen's FP8 layout); 16 rotary dims, mrope over 8 of them.
FP8_SHAPES: dict[str, object] = {
    "head_dim": 64,
    "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2], "mrope_interleaved": True,
    },
}  # fmt: skip


def _fp8_mtp_model(device: str, dtype: torch.dtype) -> Qwen3_8ForCausalLM:
    """The tiny model at FP8_SHAPES, its decoder projections quantized to block FP8 as on load
    (`quantize_model_fp8`), with a random bf16 head (Qwen's FP8 releases keep the head bf16)."""
    from sparkinfer.model.layers.linear import Linear
    from sparkinfer.model.weights import quantize_model_fp8

    model = build_tiny_model(seed=0, device=device, dtype=dtype, overrides=FP8_SHAPES)
    quantize_model_fp8(model)
    projections = [m for m in model.model.layers.modules() if isinstance(m, Linear)]
    assert projections and all(m.is_fp8 for m in projections)
    head = MTPHead(model.config.text, ops=model.ops, device=torch.device(device), dtype=dtype)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, p in head.named_parameters():
            scale = 0.1 if "norm" in name else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    model.mtp = head.eval()
    return model


def test_mtp_speculation_on_fp8_weights_gives_plain_decoding_bit_for_bit():
    model = _fp8_mtp_model("cpu", torch.float32)
    cfg = config(num_speculative_tokens=3, max_num_batched_tokens=48)
    off = replace(cfg, speculative="off")
    prompts = PROMPTS[:3]
    want = run_mixed_steps(Runner(model, off), off, prompts, [GREEDY] * len(prompts))
    runner = _recording_runner(model, cfg)
    got = run_mixed_steps(runner, cfg, prompts, [GREEDY] * len(prompts))
    assert got.tokens == want.tokens and got.logprobs == want.logprobs
    drafter = runner.speculative.drafter
    assert isinstance(drafter, RecordingDrafter) and drafter.proposals


@pytest.mark.gpu
def test_mtp_speculation_on_fp8_weights_on_cuda_gives_plain_decoding_bit_for_bit():
    """bf16 on the device, the FP8 kernels of the deterministic mode (the invariant decode GEMM
    for plain and verify rows alike, never the row-count routes), verify steps graphed."""
    model = _fp8_mtp_model("cuda", torch.bfloat16)
    cfg = config(max_model_len=256)
    off = replace(cfg, speculative="off")
    want = run_mixed_steps(Runner(model, off), off, PROMPTS, [GREEDY] * len(PROMPTS))
    got = run_mixed_steps(Runner(model, cfg), cfg, PROMPTS, [GREEDY] * len(PROMPTS))
    assert got.tokens == want.tokens and got.logprobs == want.logprobs


def test_start_up_warms_the_head_at_catch_ups_longer_than_any_prompt_chunk(mtp_model, monkeypatch):
    """Many requests' catch-ups at once can be longer than the longest prompt chunk start-up
    ran: the head runs once at each attention variant's shortest length past it (both
    numerics), where the caches hold the rows."""
    cfg = config(num_speculative_tokens=3, max_num_seqs=2)
    runner = Runner(mtp_model, cfg)
    drafter = runner.speculative.drafter
    assert isinstance(drafter, MTPDrafter)
    c = runner.config
    warmed = min(c.max_num_batched_tokens, c.max_model_len)
    longest = c.max_num_batched_tokens + c.max_seqs_per_step * (MAX_PENDING_ROWS + 4)
    asked: list[int] = []
    variants = (1, warmed, warmed + 1, longest, 10**9)  # the last: more rows than the caches
    monkeypatch.setattr(
        mtp_model, "kernel_warmup_lengths", lambda n: (asked.append(n), variants)[1]
    )
    head = CountingHead(drafter.head)
    drafter.head = head  # type: ignore[assignment]
    runner.speculative.warm_up()
    assert asked == [longest, longest]
    num_blocks = next(iter(runner.caches.attention.values())).k.shape[0]
    fits = (num_blocks - 1) * c.block_size
    assert warmed + 1 <= fits < 10**9
    want = [n for n in (warmed + 1, longest) if n <= fits]
    assert head.calls[MAX_PENDING_ROWS + 4 :] == want * 2


def test_steps_with_prompt_chunks_overlap_the_next_and_the_head_still_runs_over_them(
    mtp_model, monkeypatch
):
    """A step with prompt chunks (alone or beside decode rows) is read at once only when the
    scheduler asks (a request sampling in it may draft next), never for the head: the head runs
    over its prompt rows on the device, a sampled row taking its draw still in flight, so the
    drafts are still the head's plain-forward drafts and greedy output is plain decoding's."""
    cfg = config(
        num_speculative_tokens=2, speculative_adaptive=True, max_num_batched_tokens=20,
        max_num_seqs=2,
    )  # fmt: skip
    runner = _recording_runner(mtp_model, cfg, WrongDrafter)
    attach_cpu_graphs(runner, monkeypatch)  # a mixed step's decode rows come from a graph
    read_at_once_with_prompts: list[bool] = []
    run = runner.speculative.run
    monkeypatch.setattr(
        runner.speculative,
        "run",
        lambda b, f: (
            read_at_once_with_prompts.append(
                not b.is_read_at_once and not all(s.is_decode for s in b.seqs)
            ),
            run(b, f),
        )[1],
    )
    in_flight: list[int] = []
    observe = runner.speculative.observe_prompts_in_flight
    monkeypatch.setattr(
        runner.speculative,
        "observe_prompts_in_flight",
        lambda d, dh, p, ph, f: (in_flight.append(len(d)), observe(d, dh, p, ph, f))[1],
    )
    params = [replace(GREEDY, max_tokens=40)] * len(PROMPTS)  # later prompts meet cool-downs
    on = run_mixed_steps(runner, cfg, PROMPTS, params)
    off = config(speculative="off", max_num_batched_tokens=20, max_num_seqs=2)
    assert on.tokens == run_mixed_steps(Runner(mtp_model, off), off, PROMPTS, params).tokens
    assert any(in_flight) and not any(read_at_once_with_prompts)  # some beside decode rows
    drafter = runner.speculative.drafter
    assert isinstance(drafter, WrongDrafter) and len(drafter.proposals) > 4
    _assert_heads_drafts(mtp_model, drafter.proposals)
