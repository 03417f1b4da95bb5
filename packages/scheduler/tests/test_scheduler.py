import random

import pytest
from scheduler_testing import FakeRunner, fake_prompt_logprobs, next_token
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.errors import ContextLengthExceeded, InvalidRequest, RequestTooLarge
from sparkinfer.scheduler.request import FinishReason, RequestOutput, SamplingParams
from sparkinfer.scheduler.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(autouse=True, params=[False, True], ids=["sync", "overlapped"])
def overlap(request, monkeypatch):
    """Every test runs with samples read at once and with them one step in flight."""
    monkeypatch.setattr(FakeRunner, "default_overlap", request.param)
    return request.param


def make(num_blocks=64, num_slots=8, **cfg):
    config = SchedulerConfig(**{"block_size": 4, "max_model_len": 128, **cfg})
    outputs: dict[str, list[RequestOutput]] = {}
    sched = Scheduler(
        config,
        num_blocks=num_blocks,
        num_slots=num_slots,
        vocab_size=100,
        emit=lambda req, out: outputs.setdefault(req.request_id, []).append(out),
    )
    return sched, FakeRunner(num_blocks=num_blocks, num_slots=num_slots), outputs


def drain(sched, runner, max_steps=10_000):
    for _ in range(max_steps):
        if not sched.has_work():
            return
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))
    raise AssertionError("scheduler did not drain")


def expected(prompt, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens, 100))
    return tokens[len(prompt) :]


def tokens_of(outs):
    return [t for o in outs for t in o.new_token_ids]


def test_admission_is_fifo_and_bounded_by_max_num_seqs():
    sched, _, _ = make(max_num_seqs=2)
    for i in range(3):
        sched.add_request(f"r{i}", [1, 2], GREEDY)
    batch = sched.schedule()
    assert [s.req.request_id for s in batch.seqs] == ["r0", "r1"]
    assert [r.request_id for r in sched.waiting] == ["r2"]


def test_long_prompt_is_chunked_under_the_token_budget(overlap):
    sched, runner, outputs = make(max_num_batched_tokens=8)
    sched.add_request("long", list(range(20)), GREEDY)
    sizes = []
    while sched.has_work():
        batch = sched.schedule()
        sizes.append([s.num_new_tokens for s in batch.seqs])
        sched.update(batch, runner.run(batch))
    if overlap:  # the last step only reads the last sample
        assert sizes.pop() == []
    assert sizes[:3] == [[8], [8], [4]] and all(s == [1] for s in sizes[3:])
    assert tokens_of(outputs["long"]) == expected(range(20), 4)


def test_deterministic_chunks_end_on_gdn_block_multiples():
    """Two decodes take 2 of a 200-token budget: the prompt is cut at 128, not at 198, so its cut
    points are the same as when it runs alone; the last chunk is whatever is left."""
    sched, runner, outputs = make(
        num_blocks=128, max_num_batched_tokens=200, max_model_len=512, deterministic=True
    )
    assert sched.config.chunk_alignment == 128
    for rid in ("a", "b"):
        sched.add_request(rid, [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=30))
    batch = sched.schedule()
    sched.update(batch, runner.run(batch))
    prompt = [i % 100 for i in range(300)]
    sched.add_request("long", prompt, GREEDY)
    ends = []
    while sched.has_work():
        batch = sched.schedule()
        ends += [
            s.num_cached_tokens + s.num_new_tokens
            for s in batch.seqs
            if s.req.request_id == "long" and not s.is_decode
        ]
        sched.update(batch, runner.run(batch))
    assert ends == [128, 300]
    assert tokens_of(outputs["long"]) == expected(prompt, 4)
    loose = SchedulerConfig(max_num_batched_tokens=100, deterministic=False)
    assert loose.chunk_alignment == 1
    assert SchedulerConfig(max_num_batched_tokens=127, deterministic=True).chunk_alignment == 1


def test_decodes_are_scheduled_before_prefill_chunks():
    sched, runner, _ = make(max_num_batched_tokens=6)
    sched.add_request("a", [1, 2, 3], GREEDY)
    batch = sched.schedule()
    sched.update(batch, runner.run(batch))
    sched.add_request("b", list(range(30)), GREEDY)
    batch = sched.schedule()
    assert [(s.req.request_id, s.num_new_tokens) for s in batch.seqs] == [("a", 1), ("b", 5)]
    assert batch.seqs[0].is_decode and not batch.seqs[1].is_decode


def test_preemption_recomputes_newest_and_output_is_unchanged():
    # 6 blocks of 4 tokens: three requests growing to 14 tokens cannot all stay resident.
    sched, runner, outputs = make(num_blocks=6)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    prompts = {f"r{i}": [i + 1] * 4 for i in range(3)}
    for rid, prompt in prompts.items():
        sched.add_request(rid, prompt, params)
    drain(sched, runner)
    assert sched.stats().num_preemptions > 0
    for rid, prompt in prompts.items():
        assert tokens_of(outputs[rid]) == expected(prompt, 10)
        assert outputs[rid][-1].finish_reason is FinishReason.LENGTH
    assert sched.blocks.num_free_blocks == 6 and sched.slots.num_free_slots == 8


def test_prompt_logprobs_gathered_across_chunks_and_preemptions_emitted_once():
    # Small chunks and a short cache: prompts are scored over several chunks, and some
    # requests are preempted (before or after their first output) and recomputed.
    sched, runner, outputs = make(num_blocks=8, max_num_batched_tokens=5)
    rng = random.Random(1)
    prompts = {f"r{i}": [rng.randrange(100) for _ in range(rng.randint(1, 12))] for i in range(6)}
    for rid, prompt in prompts.items():
        num_top = None if rid == "r0" else 0
        sched.add_request(rid, prompt, SamplingParams(max_tokens=6, prompt_logprobs=num_top))
    drain(sched, runner)
    assert sched.stats().num_preemptions > 0
    for rid, prompt in prompts.items():
        first, *rest = outputs[rid]
        assert tokens_of(outputs[rid]) == expected(prompt, 6)
        assert first.prompt_logprobs == (() if rid == "r0" else fake_prompt_logprobs(prompt))
        assert all(o.prompt_logprobs == () for o in rest)


def test_preempted_request_goes_back_to_the_front():
    sched, runner, outputs = make(num_blocks=4)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    sched.add_request("old", [1] * 7, params)
    sched.add_request("new", [2] * 7, params)
    while not sched.stats().num_preemptions:
        batch = sched.schedule()
        sched.update(batch, runner.run(batch))
    sched.add_request("later", [3], params)
    assert [r.request_id for r in sched.waiting] == ["new", "later"]
    assert sched.waiting[0].num_computed_tokens == 0 and not sched.waiting[0].block_ids
    drain(sched, runner)
    assert tokens_of(outputs["new"]) == expected([2] * 7, 8)


def test_abort_frees_blocks_and_slot_and_emits_once(overlap):
    sched, runner, outputs = make()
    sched.add_request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=50))
    sched.add_request("w", [1], GREEDY)
    batch = sched.schedule()
    sched.update(batch, runner.run(batch))
    assert sched.abort("a") and sched.abort("w")
    assert not sched.abort("a")
    assert outputs["a"][-1].finish_reason is FinishReason.ABORT
    # Overlapped, w's first sample was still in flight: it is dropped with the request.
    first = [] if overlap else [None]
    assert [o.finish_reason for o in outputs["w"]] == [*first, FinishReason.ABORT]
    assert sched.blocks.num_free_blocks == 64 and sched.slots.num_free_slots == 8
    assert not sched.has_work()


def test_stop_tokens_min_tokens_and_eos():
    sched, runner, outputs = make(eos_token_ids=(7,))
    prompt = [1, 2]
    first = expected(prompt, 1)[0]
    sched.add_request("stop", prompt, SamplingParams(stop_token_ids=(first,), max_tokens=5))
    sched.add_request("min", prompt, SamplingParams(stop_token_ids=(first,), min_tokens=2))
    drain(sched, runner)
    assert tokens_of(outputs["stop"]) == [first]
    assert outputs["stop"][-1].finish_reason is FinishReason.STOP
    assert len(tokens_of(outputs["min"])) > 1


def test_max_tokens_none_runs_to_the_context_limit():
    sched, runner, outputs = make(max_model_len=12)
    sched.add_request("r", [1, 2, 3], SamplingParams(temperature=0.0))
    drain(sched, runner)
    assert len(tokens_of(outputs["r"])) == 9
    assert outputs["r"][-1].finish_reason is FinishReason.LENGTH


def test_rejections_are_typed():
    sched, _, _ = make(num_blocks=2, max_model_len=32)
    with pytest.raises(ContextLengthExceeded, match="prompt has 40 tokens; max_model_len is 32"):
        sched.add_request("a", [1] * 40, GREEDY)
    with pytest.raises(ContextLengthExceeded, match="lower max_tokens"):
        sched.add_request("a", [1] * 20, SamplingParams(max_tokens=20))
    with pytest.raises(RequestTooLarge, match="holds 8"):
        sched.add_request("a", [1] * 6, SamplingParams(max_tokens=10))
    with pytest.raises(InvalidRequest, match="empty"):
        sched.add_request("a", [], GREEDY)
    with pytest.raises(InvalidRequest, match=r"\[0, 100\)"):
        sched.add_request("a", [100], GREEDY)
    # The sampler indexes logits by these: a bad one failed the whole step, or wrapped around.
    with pytest.raises(InvalidRequest, match=r"stop_token_ids holds -1; token ids must be in"):
        sched.add_request("a", [1], SamplingParams(stop_token_ids=(-1,)))
    with pytest.raises(InvalidRequest, match=r"logit_bias holds 100; token ids must be in"):
        sched.add_request("a", [1], SamplingParams(logit_bias=((3, 1.0), (100, -1.0))))
    sched.add_request("a", [1], GREEDY)
    with pytest.raises(InvalidRequest, match="already running"):
        sched.add_request("a", [1], GREEDY)


def test_failed_step_ends_only_its_requests():
    sched, runner, outputs = make(max_num_seqs=1)
    sched.add_request("bad", [1], GREEDY)
    sched.add_request("good", [2], GREEDY)
    runner.fail_when = {"bad"}
    batch = sched.schedule()
    with pytest.raises(RuntimeError) as exc:
        runner.run(batch)
    sched.fail(batch, exc.value)
    drain(sched, runner)
    assert outputs["bad"][-1].finish_reason is FinishReason.ERROR
    assert "boom in bad" in outputs["bad"][-1].error
    assert outputs["good"][-1].finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("cfg", "max_prompt"),
    [
        ({"num_blocks": 40, "max_num_batched_tokens": 24}, 30),
        # deterministic: chunks cut on multiples of 128 under block pressure and preemption
        ({"num_blocks": 90, "max_num_batched_tokens": 200, "max_model_len": 320,
          "deterministic": True}, 250),
    ],
    ids=["cut_anywhere", "aligned_chunks"],
)  # fmt: skip
def test_no_leaks_after_random_requests_and_aborts(cfg, max_prompt):
    rng = random.Random(0)
    sched, runner, outputs = make(num_slots=6, **cfg)
    live: list[str] = []
    for i in range(1000):
        rid = f"r{i}"
        prompt = [rng.randrange(100) for _ in range(rng.randint(1, max_prompt))]
        sched.add_request(rid, prompt, SamplingParams(max_tokens=rng.randint(1, 20)))
        live.append(rid)
        for _ in range(rng.randint(0, 3)):
            if sched.has_work():
                batch = sched.schedule()
                for seq in batch.seqs:  # a chunk that leaves prompt behind ends aligned
                    end = seq.num_cached_tokens + seq.num_new_tokens
                    assert end == seq.num_tokens or end % sched.config.chunk_alignment == 0
                sched.update(batch, runner.run(batch))
        if rng.random() < 0.2:
            sched.abort(rng.choice(live))
    drain(sched, runner)
    assert sched.blocks.num_free_blocks == cfg["num_blocks"] and sched.slots.num_free_slots == 6
    assert len(outputs) == 1000
    for outs in outputs.values():
        assert sum(o.is_finished for o in outs) == 1 and outs[-1].is_finished
    stats = sched.stats()
    assert stats.num_finished + stats.num_aborted == 1000 and stats.num_preemptions > 0


def test_overlapped_requests_never_run_past_max_tokens():
    """A request whose last token is in flight is not scheduled again: it finishes when that
    token is read, with no row wasted and no block allocated past its length."""
    sched, runner, outputs = make(max_num_seqs=2)
    runner.overlap = True
    sched.add_request("r", [1, 2, 3], SamplingParams(max_tokens=4))
    rows = 0
    while sched.has_work():
        batch = sched.schedule()
        rows += sum(s.num_new_tokens for s in batch.seqs)
        sched.update(batch, runner.run(batch))
    assert rows == 3 + 3  # the prompt, then the first three samples fed back
    assert tokens_of(outputs["r"]) == expected([1, 2, 3], 4)
    assert outputs["r"][-1].finish_reason is FinishReason.LENGTH


def test_a_failed_step_also_ends_requests_with_samples_in_flight():
    """The runner drops the step in flight when a step fails; the requests waiting for its
    samples end with ERROR too, instead of waiting forever."""
    sched, runner, outputs = make()
    runner.overlap = True
    sched.add_request("a", [1, 2], GREEDY)
    sched.add_request("b", [3], GREEDY)
    batch = sched.schedule()
    sched.update(batch, runner.run(batch))  # both samples in flight
    sched.abort("a")
    sched.add_request("c", [4], GREEDY)
    runner.fail_when = {"c"}
    batch = sched.schedule()
    with pytest.raises(RuntimeError):
        runner.run(batch)
    sched.fail(batch, RuntimeError("boom"))
    assert outputs["b"][-1].finish_reason is FinishReason.ERROR
    assert outputs["c"][-1].finish_reason is FinishReason.ERROR
    assert not sched.has_work()
    assert sched.blocks.num_free_blocks == 64 and sched.slots.num_free_slots == 8


def test_a_step_holds_no_more_sequences_than_state_slots():
    sched, _, _ = make(num_slots=2, max_num_seqs=8)
    assert sched.config.num_state_slots == 2 and sched.max_num_seqs == 2
