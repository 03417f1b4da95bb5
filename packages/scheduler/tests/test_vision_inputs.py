"""Images and videos through the engine (CPU): the same tokens as the model computed directly."""

from __future__ import annotations

import threading

import pytest
import torch
from scheduler_testing import TINY_CONFIG, RowSnapshot, attach_cpu_graphs, run_steps
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.config import parse_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.mrope import get_rope_positions, text_positions
from sparkinfer.model.vision import merge_vision_embeddings
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.errors import InvalidRequest
from sparkinfer.scheduler.request import MultimodalInputs, Request, SamplingParams
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.vision.inputs import seq_positions, step_positions

IMAGE, VIDEO, START, END = 240, 241, 242, 243
NUM_NEW = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_NEW)
MM_CONFIG = {
    "model_type": "qwen3_5",
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "image_token_id": IMAGE,
    "video_token_id": VIDEO,
    "vision_start_token_id": START,
    "vision_end_token_id": END,
    "text_config": {k: v for k, v in TINY_CONFIG.items() if k != "model_type"},
    "vision_config": {
        "depth": 1,
        "hidden_size": 16,
        "num_heads": 2,
        "intermediate_size": 32,
        "out_hidden_size": 64,
        "num_position_embeddings": 16,
    },
}
# an image of 8x8 patches (16 pad tokens) and a 2-group video of 4x4 patches (4 pads per group)
GRIDS = ((1, 8, 8), (2, 4, 4))
KINDS = ("image", "video")


@pytest.fixture(scope="module")
def mm_model() -> Qwen3_8ForCausalLM:
    model = Qwen3_8ForCausalLM(
        parse_model_config(MM_CONFIG), device="cpu", dtype=torch.float32, num_real_tokens=250
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.rand(p.shape, generator=gen))
            elif "norm" in name and not name.startswith("visual."):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * (p[0].numel() ** -0.5))
    return model.eval()


def mm_prompt(seed: int) -> tuple[list[int], MultimodalInputs]:
    """Text, an image block, text, a video (timestamp text before each group), text."""
    gen = torch.Generator().manual_seed(seed)
    text = torch.randint(0, 200, (20,), generator=gen).tolist()
    ids = [*text[:5], START, *[IMAGE] * 16, END, *text[5:8]]
    for g in range(2):
        ids += [*text[8 + 2 * g : 10 + 2 * g], START, *[VIDEO] * 4, END]
    ids += text[12:]
    pixels = torch.randn(sum(t * h * w for t, h, w in GRIDS), 1536, generator=gen)
    rope = get_rope_positions(
        ids, [GRIDS[0]], [GRIDS[1]], image_token_id=IMAGE, video_token_id=VIDEO
    )
    return ids, MultimodalInputs(pixels, GRIDS, KINDS, rope.positions, rope.rope_delta)


@torch.no_grad()
def reference_greedy(model: Qwen3_8ForCausalLM, ids: list[int], mm: MultimodalInputs) -> list[int]:
    """Tower, merge and MRoPE prefill in one forward, then decode at n + rope_delta."""
    assert model.visual is not None and mm.positions is not None
    num_blocks = -(-(len(ids) + NUM_NEW) // 16)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=16, num_slots=1, device="cpu"
    )
    prompt = torch.tensor(ids)
    rows = model.visual(mm.pixel_values, list(mm.grid_thw))
    embeds = merge_vision_embeddings(
        model.embed_input_ids(prompt), (prompt == IMAGE) | (prompt == VIDEO), rows
    )
    table, tokens, cached = list(range(num_blocks)), [], 0
    new, positions = prompt, mm.positions
    for _ in range(NUM_NEW):
        batch = ForwardBatch.build(
            [len(new)], [cached], [table], [0], caches=caches, block_size=16, device="cpu",
            positions=positions,
        )  # fmt: skip
        hidden = model(new, batch, inputs_embeds=embeds)
        tokens.append(int(model.compute_logits(hidden[batch.logits_indices]).argmax(-1)))
        cached += len(new)
        new, embeds = torch.tensor(tokens[-1:]), None
        positions = text_positions(cached, 1, mm.rope_delta)
    return tokens


def run_engine(engine: Engine, requests: list[tuple[list[int], MultimodalInputs | None]]):
    results: list[list[int]] = [[] for _ in requests]
    done = threading.Semaphore(0)
    for i, (ids, mm) in enumerate(requests):

        def on_output(out, res=results[i]):
            res.extend(out.new_token_ids)
            if out.is_finished:
                assert out.error is None, out.error
                done.release()

        engine.add_request(f"r{i}", ids, GREEDY, on_output=on_output, multimodal=mm)
    for _ in requests:
        assert done.acquire(timeout=120)
    return results


@pytest.fixture(scope="module")
def prompts() -> list[tuple[list[int], MultimodalInputs]]:
    return [mm_prompt(seed) for seed in range(3)]


@pytest.fixture(scope="module")
def references(mm_model, prompts) -> list[list[int]]:
    return [reference_greedy(mm_model, ids, mm) for ids, mm in prompts]


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{"block_size": 16, "max_model_len": 128, **kw})


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(64, id="one_shot"),
        pytest.param(9, id="chunks_split_pad_runs"),  # 16 image pads cut at 4, 13; video at 22
    ],
)
def test_engine_matches_direct_model(mm_model, prompts, references, budget) -> None:
    engine = Engine.from_model(mm_model, config(max_num_batched_tokens=budget))
    try:
        assert run_engine(engine, prompts[:1]) == references[:1]
        assert engine.runner.vision.num_held == 0  # rows freed once the prompt is in
    finally:
        engine.shutdown()


def test_media_without_mrope_use_sequential_positions(mm_model, prompts) -> None:
    ids, mm = prompts[1]
    flat = MultimodalInputs(mm.pixel_values, mm.grid_thw, mm.kinds)  # positions None, delta 0
    sequential = MultimodalInputs(
        mm.pixel_values, mm.grid_thw, mm.kinds, torch.arange(len(ids)).expand(3, -1), 0
    )
    engine = Engine.from_model(mm_model, config(max_num_batched_tokens=9))
    try:
        assert run_engine(engine, [(ids, flat)]) == [reference_greedy(mm_model, ids, sequential)]
    finally:
        engine.shutdown()


def test_media_beside_text_and_preemption(mm_model, prompts, references, tiny_text_refs) -> None:
    """Three multimodal requests and a text one in 6 blocks of 16: some are preempted and
    recomputed (tower again, positions again) and still give the direct model's tokens."""
    text_prompt, text_ref = tiny_text_refs
    engine = Engine.from_model(mm_model, config(num_kv_blocks=6, max_num_batched_tokens=24))
    try:
        got = run_engine(engine, [*prompts, (text_prompt, None)])
        assert engine.stats().num_preemptions > 0
    finally:
        engine.shutdown()
    assert got == [*references, text_ref]


@pytest.fixture(scope="module")
def tiny_text_refs(mm_model) -> tuple[list[int], list[int]]:
    from scheduler_testing import reference_greedy as text_greedy

    prompt = list(range(10, 40))
    return prompt, text_greedy(mm_model, prompt, NUM_NEW)


def test_bad_media_is_refused_at_add_request(mm_model, tiny_model, prompts) -> None:
    ids, mm = prompts[0]
    engine = Engine.from_model(mm_model, config(num_kv_blocks=8))
    try:
        with pytest.raises(InvalidRequest, match=r"16 image pad tokens .* fill 64"):
            bigger = MultimodalInputs(
                torch.zeros(16 * 16 + 32, 1536), ((1, 16, 16), (2, 4, 4)), KINDS
            )
            engine.add_request("a", ids, GREEDY, on_output=None, multimodal=bigger)
        with pytest.raises(InvalidRequest, match=r"positions have shape \(3, 5\)"):
            short = MultimodalInputs(mm.pixel_values, GRIDS, KINDS, mm.positions[:, :5], 0)
            engine.add_request("b", ids, GREEDY, on_output=None, multimodal=short)
    finally:
        engine.shutdown()
    text_only = Engine.from_model(tiny_model, config(num_kv_blocks=8))
    try:
        with pytest.raises(InvalidRequest, match="no vision tower"):
            text_only.add_request("c", ids, GREEDY, on_output=None, multimodal=mm)
    finally:
        text_only.shutdown()
    with pytest.raises(ValueError, match="needs 96 rows"):
        MultimodalInputs(torch.zeros(3, 1536), GRIDS, KINDS)


def test_positions_of_chunks_and_decode(prompts) -> None:
    ids, mm = prompts[0]
    assert mm.positions is not None
    req = Request("p", ids, GREEDY, max_len=100, multimodal=mm)
    n = len(ids)
    req.token_ids += [7, 8]  # two generated tokens: recompute after preemption covers them
    whole = seq_positions(ScheduledSeq(req, 0, n + 2))
    assert torch.equal(whole[:, :n], mm.positions)
    assert torch.equal(whole[:, n:], torch.arange(n, n + 2).add(mm.rope_delta).expand(3, -1))
    decode = ScheduledSeq(req, n + 1, 1)
    text = ScheduledSeq(Request("t", [1, 2, 3], GREEDY, max_len=9), 1, 2)
    # decode and text chunks alone: [T] positions; a chunk inside the media prompt: [3, T]
    assert step_positions([decode, text]).tolist() == [n + 1 + mm.rope_delta, 1, 2]
    mixed = step_positions([ScheduledSeq(req, 3, 6), text])
    assert torch.equal(mixed, torch.cat([mm.positions[:, 3:9], torch.tensor([[1, 2]] * 3)], 1))


@pytest.mark.cpu_only
@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(1, id="media_prompt_alone"),
        pytest.param(2, id="beside_a_text_decode"),
    ],
)
def test_one_token_media_prompt_chunks_stay_off_the_graph(
    monkeypatch, mm_model, prompts, references, tiny_text_refs, budget
) -> None:
    """Budgets of 1 and 2 tokens cut media prompts into 1-token chunks after the first: one new
    token on a cache, like a decode. Replayed, such a row took position n + rope_delta instead
    of its MRoPE prompt position, the pad token's embedding instead of its vision row, and
    (beside a sampling decode) gave the sampler a logits row too many; the prompt must run
    eagerly, and only generated tokens replay (CPU stand-ins for the graphs)."""
    text_prompt, text_ref = tiny_text_refs
    requests = [prompts[0]] if budget == 1 else [(text_prompt, None), prompts[1]]
    want = [references[0]] if budget == 1 else [text_ref, references[1]]
    cfg = config(max_num_seqs=4, max_num_batched_tokens=budget)
    runner = Runner(mm_model, cfg)
    replayed = attach_cpu_graphs(runner, monkeypatch)
    steps: list[list[RowSnapshot]] = []
    assert run_steps(runner, cfg, requests, GREEDY, steps=steps) == want
    assert any(r.is_lone_prompt_token for rows in steps for r in rows)
    assert runner.vision.num_held == 0  # the eager last prompt chunk freed the vision rows
    assert replayed, "no step ran on the graph"
    for rows in replayed:
        assert all(row.is_generated_last_token for row in rows), rows


@pytest.mark.gpu
def test_cuda_graph_decode_after_media_matches_eager(mm_model, prompts) -> None:
    """Graph replays take positions n + rope_delta from the static buffer, as eager decode does."""
    model = Qwen3_8ForCausalLM(
        parse_model_config(MM_CONFIG), device="cuda", dtype=torch.float32, num_real_tokens=250
    )
    model.load_state_dict(mm_model.state_dict())
    got = []
    for eager in (True, False):
        engine = Engine.from_model(
            model.eval(), config(max_num_seqs=4, max_num_batched_tokens=9, enforce_eager=eager)
        )
        try:
            assert (engine.runner.graphs is None) == eager
            got.append(run_engine(engine, prompts))
        finally:
            engine.shutdown()
    assert got[0] == got[1]
    torch.cuda.synchronize()
