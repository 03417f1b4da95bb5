"""Short prompt-chunk forwards under CUDA graphs: the graphed engine gives the eager engine's
greedy tokens (GPU, and on the CPU with stand-in streams and graphs running the real capture and
replay); the padded layout of a step; staging buffers refilled only after their last copy."""

import pytest
import torch
from scheduler_testing import (
    CpuStream,
    attach_cpu_graphs,
    attach_cpu_prefill_graphs,
    build_tiny_model,
    reference_greedy,
    run_steps,
    run_together,
    use_cpu_graph_standins,
)
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.graphs.prefill import PrefillGraphs
from sparkinfer.scheduler.request import Request, SamplingParams
from sparkinfer.scheduler.runner import Runner

PROMPTS = [[(11 * i + 3 * j) % 250 for j in range(2 + 9 * i)] for i in range(5)]


@pytest.mark.cpu_only
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_graphed_prefill_gives_the_eager_tokens(monkeypatch, tiny_model, deterministic):
    """Prompts of 2-38 tokens under a 40-token budget, 4 sequences a step, graphs for 16, 32 and
    40 tokens: every step's prompt chunks replay a graph (four at once, or one padded to its
    bucket; decode rows run in their own forward); every token equals the eager runner's and the
    reference decode's."""
    cfg = SchedulerConfig(
        block_size=16, max_model_len=96, max_num_seqs=4, max_num_batched_tokens=40,
        prefill_graph_tokens=40, deterministic=deterministic,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=5)
    requests = [(p, None) for p in PROMPTS]
    eager = run_steps(Runner(tiny_model, cfg), cfg, requests, params)
    runner = Runner(tiny_model, cfg)
    attach_cpu_graphs(runner, monkeypatch)
    replayed = attach_cpu_prefill_graphs(runner, monkeypatch, max_seqs=4)
    graphed = run_steps(runner, cfg, requests, params)
    assert graphed == eager == [reference_greedy(tiny_model, p, 5) for p in PROMPTS]
    assert replayed, "no step ran on a prefill graph"
    assert runner.prefill_graphs is not None
    assert runner.prefill_graphs.token_sizes == (16, 32, 40)
    assert any(sum(r.num_new_tokens for r in rows) not in (16, 32, 40) for rows in replayed)
    assert any(len(rows) == 4 for rows in replayed), "no graph ran four prompt chunks"
    assert not any(r.is_generated_last_token for rows in replayed for r in rows)


def _graphs(tiny_model, max_seqs: int = 3) -> PrefillGraphs:
    caches = allocate_caches(
        tiny_model.cache_spec(), num_blocks=4, block_size=16, num_slots=4, device="cpu"
    )
    return PrefillGraphs(
        tiny_model, caches, token_sizes=(16, 32), max_seqs=max_seqs, max_blocks_per_seq=4,
        block_size=16, stream=CpuStream(),  # type: ignore[arg-type]
    )  # fmt: skip


def _seq(request_id: str, prompt: list[int], blocks: list[int], slot: int, cached: int, new: int):
    req = Request(request_id, prompt, SamplingParams(), max_len=64)
    req.block_ids, req.state_slot = blocks, slot
    return ScheduledSeq(req, num_cached_tokens=cached, num_new_tokens=new)


@pytest.mark.cpu_only
def test_a_step_is_padded_with_one_sequence_of_the_rest_and_empty_ones(monkeypatch, tiny_model):
    """Two chunks (the second the end of its prompt, so it samples) in a 32-token bucket: their
    rows first, then a padding sequence over the remaining tokens with no state slot and no KV
    rows, then empty sequences; the one logits row is the sampled chunk's last token."""
    use_cpu_graph_standins(monkeypatch, CpuStream())
    graphs = _graphs(tiny_model)
    a = _seq("a", list(range(40)), [2, 0, 1], slot=1, cached=16, new=8)  # mid-prompt
    b = _seq("b", list(range(5)), [3], slot=2, cached=0, new=5)  # whole prompt
    assert graphs.bucket_for([a, b]) == 16 and graphs.bucket_for([a, a, a, a]) is None
    assert graphs._fill([a, b], 32, [-1, -1]) == 1
    tokens, seqs = graphs._tokens_np, graphs._seqs_np
    assert tokens[0, :13].tolist() == list(range(16, 24)) + list(range(5))
    assert tokens[1, :13].tolist() == list(range(16, 24)) + list(range(5))
    assert tokens[2, :8].tolist() == list(range(8))  # a's second block (16-31) is block 0
    assert tokens[2, 8:13].tolist() == list(range(48, 53))  # block 3
    assert (tokens[2, 13:32] == -1).all() and (tokens[3, :32] == -1).all()
    assert seqs[0].tolist() == [0, 8, 13, 32, 32]  # cu_seqlens: a, b, padding, empty
    assert seqs[1, :4].tolist() == [16, 0, 0, 0]  # cached
    assert seqs[2, :4].tolist() == [24, 5, 19, 0]  # context
    assert seqs[3, :4].tolist() == [1, 2, -1, -1]  # state slots
    assert graphs._tables_np[:2, :3].tolist() == [[2, 0, 1], [3, 0, 0]]
    assert graphs._logits_np.tolist()[0] == 12


@pytest.mark.cpu_only
def test_block_table_rows_a_step_leaves_are_cleared_on_the_device(monkeypatch, tiny_model):
    """Each step copies only the table rows it or the step before used: after two chunks, one
    chunk leaves the second row (now the padding sequence's) zero on the host and the device."""
    use_cpu_graph_standins(monkeypatch, CpuStream())
    graphs = _graphs(tiny_model)
    a = _seq("a", list(range(40)), [2, 0, 1], slot=1, cached=16, new=8)
    b = _seq("b", list(range(5)), [3], slot=2, cached=0, new=5)
    with torch.inference_mode():
        graphs._load([a, b], 16, None, [None, None])
        assert graphs.block_tables[:2, :3].tolist() == [[2, 0, 1], [3, 0, 0]]
        graphs._load([a], 16, None, [None])
    assert graphs.block_tables[:2, :3].tolist() == [[2, 0, 1], [0, 0, 0]]
    assert not graphs.block_tables[1:].any()


@pytest.mark.cpu_only
def test_prefill_staging_buffers_are_refilled_only_after_the_last_copy(monkeypatch, tiny_model):
    events: list[str] = []
    use_cpu_graph_standins(monkeypatch, CpuStream(), events)
    graphs = _graphs(tiny_model)
    with torch.inference_mode():
        graphs.capture()
    events.clear()
    seq = _seq("a", [1, 2, 3], [0], slot=0, cached=0, new=3)
    with torch.inference_mode():
        for _ in range(3):
            graphs.run([seq], 16, [None], None)
    assert events == ["synchronize", "record"] * 3


@pytest.mark.gpu
def test_graphed_prefill_gives_the_eager_bits_on_cuda():
    """Prompts of 1 to 300 tokens (graphs up to 128 tokens; the 300-token prompt ends on one),
    each alone and all together, batch-invariant numerics: the greedy tokens and logprobs of
    eager steps, bit for bit."""
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    prompts = [[(7 * i + 3 * j) % 250 for j in range(n)] for i, n in enumerate((1, 9, 70, 300))]
    cfg = SchedulerConfig(
        block_size=16, max_model_len=400, max_num_seqs=4, max_num_batched_tokens=256,
        prefill_graph_tokens=128, deterministic=True,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0)

    def generate(config: SchedulerConfig) -> list[list[tuple[int, float]]]:
        engine = Engine.from_model(model, config)
        try:
            if not config.enforce_eager:
                assert engine.runner.prefill_graphs is not None
                assert engine.runner.prefill_graphs.token_sizes == (16, 32, 64, 128)
            alone = [run_together(engine, [p], params)[0] for p in prompts]
            return alone + run_together(engine, prompts, params)
        finally:
            engine.shutdown()

    eager = generate(SchedulerConfig(**{**cfg.__dict__, "enforce_eager": True}))
    assert generate(cfg) == eager
    torch.cuda.synchronize()
