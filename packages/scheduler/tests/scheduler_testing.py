"""Test helpers: a fake runner, a tiny random model on CPU, a plain reference decode, and CPU
stand-ins for CUDA streams and graphs that run the real `DecodeGraphs` and `PrefillGraphs`
capture and replay."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.config import parse_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.cache import allocate_drafter_cache
from sparkinfer.model.drafters.config import DrafterConfig, check_drafter_fits, parse_drafter_config
from sparkinfer.model.drafters.dflash import BlockDrafter, SharedTargetModules
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.scheduler.batch import ModelOutput, SampledToken, ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.graphs.decode import DecodeGraphs
from sparkinfer.scheduler.graphs.prefill import PrefillGraphs
from sparkinfer.scheduler.graphs.verify import VerifyGraphs
from sparkinfer.scheduler.request import (
    MultimodalInputs,
    Request,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.scheduler import Scheduler
from sparkinfer.scheduler.speculative.block_drafter import DraftModelDrafter


class FakeRunner:
    """Next token = a hash of the request's tokens so far, so recompute gives the same output.

    Prompt logprobs are fake too: prompt token i gets logprob -i (see `fake_prompt_logprobs`).
    With `overlap`, a step's samples come back with the next call, as the real runner's do
    (None: `default_overlap`, which a test module may parametrize).
    """

    default_overlap = False

    def __init__(
        self,
        *,
        num_blocks: int = 64,
        num_slots: int = 8,
        vocab_size: int = 100,
        overlap: bool | None = None,
        snapshot_rows: Sequence[int] = (),
    ) -> None:
        self.overlap = type(self).default_overlap if overlap is None else overlap
        self.snapshot_rows = snapshot_rows
        self._inflight: list[ScheduledSeq] = []
        self.num_blocks = num_blocks
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.block_size = 4
        self.batches: list[ScheduledBatch] = []
        self.fail_when: set[str] = set()  # request ids whose step raises
        self.is_closed = False

    def run(self, batch: ScheduledBatch) -> ModelOutput:
        self.batches.append(batch)
        slots = [s.req.state_slot for s in batch.seqs]
        assert None not in slots and len(set(slots)) == len(slots), slots
        # Past its cached prefix (whole blocks, shared by design) no block is held twice.
        blocks = [
            b
            for s in batch.seqs
            for b in s.req.block_ids[s.req.num_cached_prompt_tokens // self.block_size :]
        ]
        assert len(set(blocks)) == len(blocks), "a block is held twice"
        for s in batch.seqs:
            needed = s.num_cached_tokens + s.num_new_tokens
            assert len(s.req.block_ids) * self.block_size >= needed
            if s.req.request_id in self.fail_when:
                self._inflight = []
                raise RuntimeError(f"boom in {s.req.request_id}")
            assert s.is_input_inflight == any(p.req is s.req for p in self._inflight), s
        # A sample is drawn from the tokens before it, all known by the time it is resolved.
        before = [
            (p, SampledToken(next_token(p.req.token_ids, self.vocab_size))) for p in self._inflight
        ]
        sampled = [s for s in batch.seqs if s.is_sampled]
        self._inflight = sampled if self.overlap else []
        now = (
            []
            if self.overlap
            else [(s, SampledToken(next_token(s.req.token_ids, self.vocab_size))) for s in sampled]
        )
        return ModelOutput(
            samples=tuple(before + now),
            prompt_logprobs={
                s.req.request_id: _fake_prompt_logprobs(s)
                for s in batch.seqs
                if s.num_prompt_logprobs
            },
        )

    def check_multimodal(self, prompt_token_ids, mm) -> None:
        """Media are not run here: any well-formed multimodal input is accepted."""

    def close(self) -> None:
        self.is_closed = True


def fake_prompt_logprobs(prompt: list[int]) -> tuple[TokenLogprob, ...]:
    """What FakeRunner reports for a whole prompt: token i (from 1) has logprob -i."""
    return tuple(TokenLogprob(t, -float(i)) for i, t in enumerate(prompt) if i > 0)


def _fake_prompt_logprobs(seq: ScheduledSeq) -> tuple[TokenLogprob, ...]:
    start = seq.num_cached_tokens + 1
    targets = seq.req.token_ids[start : start + seq.num_prompt_logprobs]
    return tuple(TokenLogprob(t, -float(start + j)) for j, t in enumerate(targets))


def next_token(tokens: list[int], vocab_size: int) -> int:
    return (sum(tokens) * 31 + len(tokens)) % vocab_size


TINY_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}


def build_tiny_model(
    seed: int = 0,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    overrides: dict[str, object] | None = None,
) -> Qwen3_8ForCausalLM:
    """A 4-layer (3 GDN + 1 attention) model with random weights (fp32 on CPU by default; the
    values are drawn on the CPU in fp32 whatever the device and dtype); `overrides` replace
    entries of TINY_CONFIG."""
    config = parse_model_config({**TINY_CONFIG, **(overrides or {})})
    model = Qwen3_8ForCausalLM(config, device=device, dtype=dtype, num_real_tokens=250)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.rand(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5))
    return model.eval()


TINY_DRAFTER_BLOCK = 5  # 4 drafts a step
TINY_DRAFTER_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "rope_theta": 10_000_000,
    "block_size": TINY_DRAFTER_BLOCK,
    "dflash_config": {"mask_token_id": 249, "target_layer_ids": [0, 2, 3]},
}


def build_tiny_block_drafter(
    target: Qwen3_8ForCausalLM, gen: torch.Generator
) -> tuple[BlockDrafter, DrafterConfig]:
    """A tiny DFlash drafter (TINY_DRAFTER_CONFIG) sharing `target`'s embedding and head, on its
    device and dtype, with random weights drawn on the CPU from `gen`: (drafter, its config)."""
    config = parse_drafter_config(TINY_DRAFTER_CONFIG)
    check_drafter_fits(config, target.config.text)
    shared = SharedTargetModules(target.model.embed_tokens, target.lm_head)
    device = target.lm_head.weight.device
    drafter = BlockDrafter(config, shared, ops=target.ops, device=device, dtype=target.dtype)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5))
    return drafter, config


def record_proposals(
    proposals: list[tuple[list[int], list[int]]],
    seqs: Sequence[ScheduledSeq],
    out: list[list[int]],
) -> list[list[int]]:
    """Append (tokens so far, drafts) of each row that got drafts to `proposals`; returns out."""
    for seq, drafts in zip(seqs, out, strict=True):
        if drafts:
            proposals.append((list(seq.req.token_ids), drafts))
    return out


class RecordingBlockDrafter(DraftModelDrafter):
    """Records (tokens so far, drafts) of every proposal."""

    proposals: list[tuple[list[int], list[int]]]

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        return record_proposals(self.proposals, seqs, super().propose(seqs, num_drafts))


def recording_block_runner(
    target: Qwen3_8ForCausalLM, drafter: BlockDrafter, cfg: SchedulerConfig
) -> tuple[Runner, RecordingBlockDrafter]:
    """A runner of `cfg` speculating with `drafter`, its proposals recorded: (runner, recorder)."""
    runner = Runner(target, cfg, drafter=drafter)
    made = runner.speculative.drafter
    assert isinstance(made, DraftModelDrafter)
    recording = RecordingBlockDrafter(
        drafter, num_blocks=runner.num_blocks, block_size=cfg.block_size,
        max_seqs=cfg.max_num_seqs, device=runner.device,
    )  # fmt: skip
    recording.proposals = []
    runner.speculative.drafter = recording
    return runner, recording


def reference_block_drafts(
    target: Qwen3_8ForCausalLM, drafter: BlockDrafter, tokens: list[int], k: int
) -> list[int]:
    """Drafts after `tokens` from plain forwards on fresh caches: the tapped target over every
    token but the last, the drafter's context over them, then one block at the last token."""
    bs, n, block = 16, len(tokens), drafter.config.block_size
    num_blocks = -(-(n + block) // bs)
    caches = allocate_caches(
        target.cache_spec(), num_blocks=num_blocks, block_size=bs, num_slots=1, device="cpu"
    )
    cache = allocate_drafter_cache(
        drafter.cache_spec(), num_blocks=num_blocks, block_size=bs, device="cpu"
    )
    table = torch.arange(num_blocks)[None]
    with torch.inference_mode():
        batch = ForwardBatch.build(
            [n - 1], [0], [table[0].tolist()], [0], caches=caches, block_size=bs, device="cpu"
        )
        tapped = target.forward_tapped(torch.tensor(tokens[:-1]), batch).tapped
        drafter.write_context(
            tapped, torch.arange(n - 1), cache, block_tables=table,
            seq_ids=torch.zeros(n - 1, dtype=torch.int64),
        )  # fmt: skip
        anchor = torch.tensor(tokens[-1:])
        draft = drafter.propose(
            anchor, torch.tensor([n - 1]), cache, block_tables=table, num_keys=n - 1 + block
        )
        out: list[int] = drafter.draft_tokens(draft, anchor).tokens[0, :k].tolist()
    return out


def reference_greedy(model: Qwen3_8ForCausalLM, prompt: list[int], num_new: int) -> list[int]:
    """Prefill the prompt in one forward, then decode token by token: no engine involved."""
    block_size = 16
    num_blocks = -(-(len(prompt) + num_new) // block_size)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=block_size, num_slots=1, device="cpu"
    )
    table = list(range(num_blocks))
    tokens = list(prompt)
    cached, new = 0, list(prompt)
    for _ in range(num_new):
        batch = ForwardBatch.build(
            [len(new)], [cached], [table], [0], caches=caches, block_size=block_size, device="cpu"
        )
        hidden = model(torch.tensor(new), batch)
        token = int(model.compute_logits(hidden[batch.logits_indices]).argmax(-1))
        tokens.append(token)
        cached += len(new)
        new = [token]
    return tokens[len(prompt) :]


def reference_logits(model: Qwen3_8ForCausalLM, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] fp32 of one plain forward over the whole sequence."""
    block_size = 16
    num_blocks = -(-len(tokens) // block_size)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=block_size, num_slots=1, device="cpu"
    )
    batch = ForwardBatch.build(
        [len(tokens)], [0], [list(range(num_blocks))], [0],
        caches=caches, block_size=block_size, device="cpu",
    )  # fmt: skip
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(tokens), batch))


class CpuStream:
    """Stands in for a CUDA stream on the CPU: records the streams it was ordered after."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.waited_on: list[CpuStream] = []

    def wait_stream(self, other: CpuStream) -> None:
        self.waited_on.append(other)

    def synchronize(self) -> None:
        pass


class CpuGraph:
    """Stands in for torch.cuda.CUDAGraph: capture just runs the forward; replay runs `rerun`
    (bound after capture), which writes the captured output as a real replay would."""

    def __init__(self) -> None:
        self.rerun: Callable[[], object] | None = None

    def replay(self) -> None:
        if self.rerun is not None:
            self.rerun()


@dataclass(frozen=True)
class RowSnapshot:
    """A scheduled row as it stood when it ran (its request grows once the step is recorded)."""

    num_cached_tokens: int
    num_new_tokens: int
    num_prompt_tokens: int
    num_tokens: int

    @classmethod
    def of(cls, seq: ScheduledSeq) -> RowSnapshot:
        req = seq.req
        return cls(seq.num_cached_tokens, seq.num_new_tokens, req.num_prompt_tokens, seq.num_tokens)

    @property
    def is_generated_last_token(self) -> bool:
        """It feeds a token generated earlier and is the request's last token (so it samples)."""
        return (
            self.num_new_tokens == 1
            and self.num_cached_tokens >= self.num_prompt_tokens
            and self.num_cached_tokens + 1 == self.num_tokens
        )

    @property
    def is_lone_prompt_token(self) -> bool:
        """One prompt token on a cache, short of the prompt's end: it samples nothing."""
        return self.num_new_tokens == 1 and 0 < self.num_cached_tokens < self.num_prompt_tokens - 1


class CpuEvent:
    """Stands in for torch.cuda.Event: appends "record" and "synchronize" to `log`."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def record(self, stream: CpuStream | None = None) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("synchronize")


def use_cpu_graph_standins(
    monkeypatch: pytest.MonkeyPatch, caller: CpuStream, events: list[str] | None = None
) -> None:
    """Let `DecodeGraphs` capture on the CPU: `caller` is the stream that fills its buffers;
    `events` collects what is done with its CUDA events."""
    log = [] if events is None else events
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **kw: CpuEvent(log))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: caller)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", CpuGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)


def attach_cpu_graphs(runner: Runner, monkeypatch: pytest.MonkeyPatch) -> list[list[RowSnapshot]]:
    """Capture the real decode graphs for `runner`'s caches on the CPU and make the runner replay
    them; returns the list that collects the rows of every replay, as they were at the replay."""
    use_cpu_graph_standins(monkeypatch, CpuStream())
    graphs = DecodeGraphs(
        runner.model,
        runner.caches,
        batch_sizes=runner.config.graph_batch_sizes(
            min(runner.config.max_num_seqs, runner.num_slots)
        ),
        max_blocks_per_seq=runner.config.max_blocks_per_seq,
        block_size=runner.config.block_size,
        stream=CpuStream(),  # type: ignore[arg-type]
        observer=runner.observer,
    )
    runner.graphs = graphs
    return _replay_on_cpu(graphs, monkeypatch, lambda: runner.numerics(is_decode=True))


def attach_cpu_prefill_graphs(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, max_seqs: int
) -> list[list[RowSnapshot]]:
    """`attach_cpu_graphs` for the prefill graphs (the config's token sizes, `max_seqs`
    sequences)."""
    use_cpu_graph_standins(monkeypatch, CpuStream())
    graphs = PrefillGraphs(
        runner.model,
        runner.caches,
        token_sizes=runner.config.prefill_graph_sizes(),
        max_seqs=max_seqs,
        max_blocks_per_seq=runner.config.max_blocks_per_seq,
        block_size=runner.config.block_size,
        stream=CpuStream(),  # type: ignore[arg-type]
    )
    runner.prefill_graphs = graphs
    return _replay_on_cpu(graphs, monkeypatch, lambda: runner.numerics(is_decode=False))


def _replay_on_cpu(
    graphs: DecodeGraphs | PrefillGraphs,
    monkeypatch: pytest.MonkeyPatch,
    numerics: Callable[[], contextlib.AbstractContextManager[None]],
) -> list[list[RowSnapshot]]:
    """Capture `graphs` with the stand-ins, bind each graph's replay to a rerun of its forward
    under `numerics()`, and record the rows of every run."""
    with torch.inference_mode(), numerics():
        graphs.capture()
    for size, captured in graphs.buckets.captured.items():

        def rerun(size: int = size, output: torch.Tensor = captured.output) -> None:
            with numerics():
                output.copy_(graphs._forward(graphs._forward_batch(size)))

        assert isinstance(captured.graph, CpuGraph)
        captured.graph.rerun = rerun
    replayed: list[list[RowSnapshot]] = []
    run = graphs.run

    def recording_run(
        seqs: Sequence[ScheduledSeq], bucket: int, sources: Sequence[int | None], inflight: object
    ) -> torch.Tensor:
        replayed.append([RowSnapshot.of(s) for s in seqs])
        return run(seqs, bucket, sources, inflight)  # type: ignore[arg-type]

    monkeypatch.setattr(graphs, "run", recording_run)
    return replayed


@dataclass(frozen=True)
class VerifyReplays:
    """The bucket of every verify-graph replay and of every commit-graph replay, in order."""

    verifies: list[int]
    commits: list[int]


def attach_cpu_verify_graphs(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, *, num_drafts: int, use_taps: bool = False
) -> VerifyReplays:
    """Capture the real verify graphs (buckets 1, 2 and 4) for `runner` on the CPU stand-ins and
    make the runner replay them; returns the lists that collect the buckets replayed."""
    cfg = runner.config
    use_cpu_graph_standins(monkeypatch, CpuStream())
    graphs = VerifyGraphs(
        runner.model, runner.caches, batch_sizes=(1, 2, 4), num_drafts=num_drafts,
        max_rows=runner.plan.num_verify_rows, max_blocks_per_seq=cfg.max_blocks_per_seq,
        block_size=cfg.block_size, stream=CpuStream(), use_taps=use_taps,  # type: ignore[arg-type]
    )  # fmt: skip
    with torch.inference_mode(), runner.numerics(is_decode=True):
        graphs.capture()
    replays = VerifyReplays([], [])
    for size, captured in graphs.buckets.captured.items():

        def rerun(size: int = size, output: torch.Tensor = captured.output) -> None:
            replays.verifies.append(size)
            with runner.numerics(is_decode=True):
                output.copy_(graphs._forward(graphs._forward_batch(size)))

        assert isinstance(captured.graph, CpuGraph)
        captured.graph.rerun = rerun
    for size, captured in graphs.commits.captured.items():

        def recommit(size: int = size) -> None:
            replays.commits.append(size)
            graphs._commit_forward(size)

        assert isinstance(captured.graph, CpuGraph)
        captured.graph.rerun = recommit
    runner.verify_graphs = graphs
    return replays


def run_with_random_aborts(
    runner: Runner,
    sched: Scheduler,
    rng: random.Random,
    num_requests: int,
    add_request: Callable[[int], object],
) -> None:
    """Call `add_request(i)` for i in range(num_requests), each followed by 0 to 3 steps and, 30%
    of the time, the abort of a random unfinished request (draws from `rng`); then step until
    nothing is left."""
    for i in range(num_requests):
        add_request(i)
        for _ in range(rng.randint(0, 3)):
            if sched.has_work():
                batch = sched.schedule()
                sched.update(batch, runner.run(batch))
        if rng.random() < 0.3 and sched._requests:
            sched.abort(rng.choice(sorted(sched._requests)))
    while sched.has_work():
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))


def run_steps(
    runner: Runner,
    config: SchedulerConfig,
    requests: Sequence[tuple[list[int], MultimodalInputs | None]],
    params: SamplingParams,
    *,
    steps: list[list[RowSnapshot]] | None = None,
) -> list[list[int]]:
    """All requests queued at once, then schedule -> run -> update on this thread, so every
    step's mix of chunks and decodes follows from `config` alone; returns each one's tokens
    (and appends each step's rows to `steps`)."""
    sched = Scheduler(
        config, num_blocks=runner.num_blocks, num_slots=runner.num_slots, emit=lambda r, o: None
    )
    reqs = [
        sched.add_request(f"r{i}", ids, params, multimodal=mm)
        for i, (ids, mm) in enumerate(requests)
    ]
    while sched.has_work():
        batch = sched.schedule()
        if steps is not None:
            steps.append([RowSnapshot.of(s) for s in batch.seqs])
        sched.update(batch, runner.run(batch))
    assert all(r.error is None for r in reqs), [r.error for r in reqs]
    return [r.output_token_ids for r in reqs]


@dataclass(frozen=True)
class MixedRun:
    """What `run_mixed_steps` saw: each request's tokens and logprobs, in request order."""

    tokens: list[list[int]]
    logprobs: list[list[TokenLogprob]]
    num_late_steps: int  # steps whose output held an earlier step's samples (overlapped)
    num_preemptions: int


def run_mixed_steps(
    runner: Runner,
    config: SchedulerConfig,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
) -> MixedRun:
    """Requests with their own sampling params, all queued at once, then schedule -> run ->
    update on this thread (so each step's mix follows from `config` alone)."""
    logprobs: list[list[TokenLogprob]] = [[] for _ in prompts]

    def emit(req: Request, out: RequestOutput) -> None:
        logprobs[int(req.request_id)].extend(out.logprobs)

    sched = Scheduler(config, num_blocks=runner.num_blocks, num_slots=runner.num_slots, emit=emit)
    pairs = enumerate(zip(prompts, params, strict=True))
    reqs = [sched.add_request(str(i), prompt, sp) for i, (prompt, sp) in pairs]
    num_late = 0
    while sched.has_work():
        batch = sched.schedule()
        output = runner.run(batch)
        num_late += any(seq not in batch.seqs for seq, _ in output.samples)
        sched.update(batch, output)
    assert all(r.error is None for r in reqs), [r.error for r in reqs]
    tokens = [r.output_token_ids for r in reqs]
    return MixedRun(tokens, logprobs, num_late, sched.stats().num_preemptions)


def run_together(
    engine: Engine, prompts: Sequence[list[int]], params: SamplingParams
) -> list[list[tuple[int, float]]]:
    """Submit all prompts at once (params must ask for logprobs); each one's (token, logprob)
    pairs in order."""
    results: list[list[tuple[int, float]]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def callback(i: int):
        def on_output(out: RequestOutput) -> None:
            results[i] += [
                (t, lp.logprob) for t, lp in zip(out.new_token_ids, out.logprobs, strict=True)
            ]
            if out.is_finished:
                done.release()

        return on_output

    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params, on_output=callback(i))
    for _ in prompts:
        assert done.acquire(timeout=120), "a request did not finish"
    return results
