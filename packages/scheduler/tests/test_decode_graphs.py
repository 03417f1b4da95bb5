"""Decode under CUDA graphs: the graphed engine gives the eager engine's greedy tokens (GPU), and
on the CPU (stand-in streams and graphs running the real capture and replay) capture orders its
stream after the one that filled its buffers and only true decode rows are replayed."""

import pytest
import torch
from scheduler_testing import (
    CpuStream,
    MixedRun,
    RowSnapshot,
    attach_cpu_graphs,
    build_tiny_model,
    reference_greedy,
    run_mixed_steps,
    run_steps,
    use_cpu_graph_standins,
)
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.graphs.decode import DecodeGraphs
from sparkinfer.scheduler.request import Request, SamplingParams
from sparkinfer.scheduler.runner import Runner

PROMPTS = [[(7 * i + j) % 250 for j in range(3 + 5 * i)] for i in range(6)]


def greedy_all(engine: Engine) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12)
    return [engine.generate(p, params) for p in PROMPTS]


@pytest.mark.gpu
def test_graph_decode_matches_eager():
    model = build_tiny_model().to("cuda")
    cfg = SchedulerConfig(block_size=16, max_model_len=128, max_num_seqs=8)
    eager = Engine.from_model(model, SchedulerConfig(**{**cfg.__dict__, "enforce_eager": True}))
    try:
        expected = greedy_all(eager)
    finally:
        eager.shutdown()
    graphed = Engine.from_model(model, cfg)
    try:
        assert graphed.runner.graphs is not None
        assert graphed.runner.graphs.batch_sizes == (1, 2, 4, 8)
        assert greedy_all(graphed) == expected
        assert graphed.stats().num_used_kv_blocks == 0
    finally:
        graphed.shutdown()
    torch.cuda.synchronize()


def _ban_token_0(output_token_ids: object, row: torch.Tensor) -> None:
    row[0] = float("-inf")


@pytest.mark.gpu
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_overlapped_steps_give_the_tokens_of_steps_read_at_once_on_cuda(enforce_eager):
    """On the device, decode inputs taken from the step in flight (graph staging included) give
    the tokens and logprobs of steps read at once: greedy, seeded draws, penalties, a logits
    processor and a stop id, 9 requests, batch-invariant numerics."""
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    params = [
        SamplingParams(temperature=0.0, max_tokens=16, logprobs=3),
        SamplingParams(temperature=0.8, seed=5, max_tokens=16),
        SamplingParams(temperature=0.0, max_tokens=16, frequency_penalty=0.5),
        SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=(7, 70, 170)),
    ] * 2
    # Its steps are read at once, beside penalty rows whose last output is in flight; short, so
    # that most steps overlap.
    params.append(SamplingParams(temperature=0.0, max_tokens=3, logits_processor=_ban_token_0))
    prompts = [[(13 * i + 5 * j) % 250 for j in range(5 + 11 * i)] for i in range(9)]

    def generate(overlap: bool) -> MixedRun:
        cfg = SchedulerConfig(
            block_size=16, max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64,
            enforce_eager=enforce_eager, overlap_steps=overlap, deterministic=True,
        )  # fmt: skip
        runner = Runner(model, cfg)
        try:
            run = run_mixed_steps(runner, cfg, prompts, params)
        finally:
            runner.close()
        assert (run.num_late_steps > 0) == overlap
        return run

    overlapped, at_once = generate(True), generate(False)
    assert overlapped.tokens == at_once.tokens
    assert overlapped.logprobs == at_once.logprobs  # bit for bit
    assert len(at_once.logprobs[0]) == 16 and all(len(lp.top) == 3 for lp in at_once.logprobs[0])


class _WatchedModel:
    """The tiny model, noting at each forward which streams the graph stream waited on."""

    def __init__(self, model: torch.nn.Module, stream: CpuStream) -> None:
        self.model, self.stream = model, stream
        self.waits_at_forward: list[list[CpuStream]] = []

    def __call__(self, input_ids: torch.Tensor, batch, **kwargs) -> torch.Tensor:
        self.waits_at_forward.append(list(self.stream.waited_on))
        return self.model(input_ids, batch, **kwargs)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)


@pytest.mark.cpu_only
def test_capture_waits_for_the_stream_that_filled_the_buffers(monkeypatch, tiny_model):
    """The static buffers are filled on the caller's stream and read on the graph stream, a
    non-blocking one. Unordered, the warm-up on an H200 read input ids not yet zeroed (the
    caller's stream was still zeroing caches sized for max_model_len 32,769) and the embedding
    gathered out of bounds. Also runs the all-padding warm-up at 513-column block tables."""
    caller, graph_stream = CpuStream(), CpuStream()
    use_cpu_graph_standins(monkeypatch, caller)
    sched = SchedulerConfig(max_model_len=32_769, block_size=64, max_num_seqs=4)
    caches = allocate_caches(
        tiny_model.cache_spec(), num_blocks=4, block_size=64, num_slots=4, device="cpu"
    )
    model = _WatchedModel(tiny_model, graph_stream)
    graphs = DecodeGraphs(
        model,  # type: ignore[arg-type]
        caches,
        batch_sizes=sched.graph_batch_sizes(4),
        max_blocks_per_seq=sched.max_blocks_per_seq,
        block_size=64,
        stream=graph_stream,  # type: ignore[arg-type]
    )
    assert graphs.block_tables.shape == (4, 513)
    with torch.inference_mode():
        graphs.capture()
    assert len(model.waits_at_forward) == 2 * len(graphs.batch_sizes)  # warm-up and capture
    assert all(caller in waits for waits in model.waits_at_forward)
    for size in graphs.batch_sizes:
        assert torch.isfinite(graphs.buckets.captured[size].output[:, :250]).all()


@pytest.mark.cpu_only
def test_one_token_prompt_chunks_beside_decodes_stay_off_the_graph(monkeypatch, tiny_model):
    """A step budget of 2 tokens leaves 1 for a prompt chunk while another request decodes: a
    row with one new token on a cache, like a decode, that must not sample. Replayed, the graph
    returned a logits row for it too, so the sampler got more rows than requests and the step
    failed. Graphed, the greedy tokens equal the eager runner's and the reference decode's."""
    prompts = [[(7 * i + j) % 250 for j in range(4 + 3 * i)] for i in range(3)]
    cfg = SchedulerConfig(block_size=16, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=2)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    requests = [(p, None) for p in prompts]
    eager = run_steps(Runner(tiny_model, cfg), cfg, requests, params)
    runner = Runner(tiny_model, cfg)
    replayed = attach_cpu_graphs(runner, monkeypatch)
    steps: list[list[RowSnapshot]] = []
    graphed = run_steps(runner, cfg, requests, params, steps=steps)
    assert graphed == eager == [reference_greedy(tiny_model, p, 4) for p in prompts]
    assert any(
        any(r.is_lone_prompt_token for r in rows) and any(r.is_generated_last_token for r in rows)
        for rows in steps
    ), "no step put a 1-token prompt chunk beside a decode"
    assert replayed, "no step ran on the graph"
    for rows in replayed:  # each row feeds a generated token and samples the next
        assert all(row.is_generated_last_token for row in rows), rows


@pytest.mark.cpu_only
def test_staging_buffers_are_refilled_only_after_the_last_copy(monkeypatch, tiny_model):
    """run() copies its rows to the device from pinned host buffers without blocking. The next
    run refilled them at once; the sampler's sync usually made that safe, but after a failed
    step the queued copy could read the next step's rows (replayed twice: state updated twice).
    Each run now waits on an event recorded after its copies before writing the buffers."""
    events: list[str] = []
    use_cpu_graph_standins(monkeypatch, CpuStream(), events)
    caches = allocate_caches(
        tiny_model.cache_spec(), num_blocks=2, block_size=16, num_slots=2, device="cpu"
    )
    graphs = DecodeGraphs(
        tiny_model,
        caches,
        batch_sizes=(1, 2),
        max_blocks_per_seq=2,
        block_size=16,
        stream=CpuStream(),  # type: ignore[arg-type]
    )
    with torch.inference_mode():
        graphs.capture()
    req = Request("a", [1, 2, 3], SamplingParams(), max_len=32)
    req.token_ids.append(4)
    req.block_ids, req.state_slot = [0], 0
    seq = ScheduledSeq(req, num_cached_tokens=3, num_new_tokens=1)
    with torch.inference_mode():
        for _ in range(3):
            graphs.run([seq], 1, [None], None)
    assert events == ["synchronize", "record"] * 3
