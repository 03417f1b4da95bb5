"""The prefix cache: entries and eviction, the scheduler's checkpoints and hits (fake runner), and
greedy output with hits on the tiny model (CPU) equal to the output without the cache."""

import random
import threading
from dataclasses import replace

import pytest
import torch
from scheduler_testing import FakeRunner, build_tiny_model, reference_greedy
from sparkinfer.scheduler.batch import ScheduledBatch
from sparkinfer.scheduler.block_manager import BlockManager
from sparkinfer.scheduler.cache_plan import plan_cache
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.prefix_cache import PrefixCache
from sparkinfer.scheduler.request import MultimodalInputs, RequestOutput, SamplingParams
from sparkinfer.scheduler.runner import Runner
from sparkinfer.scheduler.scheduler import Scheduler

SNAPSHOT_ROWS = (8, 9)


def _digests(cache: PrefixCache, tokens: list[int]) -> list[int]:
    return cache.digests(tokens, [])


def test_lookup_takes_the_longest_entry_that_leaves_a_token():
    blocks = BlockManager(16, 4)
    cache = PrefixCache(blocks, (10, 11, 12), alignment=8)
    tokens = list(range(40))
    digests = _digests(cache, tokens)
    held = blocks.allocate(10)
    short = cache.insert(tokens[:8], digests, held)
    long = cache.insert(tokens[:24], digests, held)
    assert short is not None and long is not None
    assert cache.lookup(tokens, digests) is long
    assert cache.lookup(tokens[:25], digests) is long
    assert cache.lookup(tokens[:24], digests) is short  # the 24-token entry would leave nothing
    assert cache.lookup(tokens[:8], digests) is None
    other = [99, *tokens[1:]]
    assert cache.lookup(other, _digests(cache, other)) is None
    assert cache.contains(digests, 24) and not cache.contains(digests, 16)
    assert cache.longest_shared(digests, 40) == 24 and cache.longest_shared(digests, 20) == 16
    assert [blocks.ref_count(b) for b in held] == [3, 3] + [2] * 4 + [1] * 4


def test_a_digest_match_is_confirmed_token_by_token():
    """Digests are not collision-proof against crafted prompts: a hit needs the same tokens."""
    blocks = BlockManager(16, 4)
    cache = PrefixCache(blocks, (10,), alignment=8)
    tokens = list(range(20))
    digests = _digests(cache, tokens)
    entry = cache.insert(tokens[:8], digests, blocks.allocate(2))
    assert entry is not None
    forged = [50, *tokens[1:]]  # other tokens presenting the cached prefix's digests
    assert cache.lookup(forged, digests) is None
    assert cache.lookup(forged, digests, confirmed=entry) is entry  # an earlier check stands


def test_digests_extend_as_tokens_grow():
    cache = PrefixCache(BlockManager(16, 4), (10,), alignment=8)
    tokens = list(range(30))
    known = cache.digests(tokens[:13], [])
    assert len(known) == 1
    assert cache.digests(tokens, known) is known and known == _digests(cache, tokens)
    assert len(known) == 3


def test_entries_go_least_recently_used_first_and_give_back_blocks_and_rows():
    blocks = BlockManager(16, 4)
    cache = PrefixCache(blocks, (10, 11), alignment=8)
    stems = [[s] * 16 for s in (1, 2, 3)]
    held = blocks.allocate(4)
    first = cache.insert(stems[0], _digests(cache, stems[0]), held)
    second = cache.insert(stems[1], _digests(cache, stems[1]), held)
    assert first is not None and second is not None

    def find(stem: list[int]):
        prompt = [*stem, 5]
        return cache.lookup(prompt, _digests(cache, prompt))

    assert find(stems[0]) is first  # the first is now the most recent
    third = cache.insert(stems[2], _digests(cache, stems[2]), held)
    assert third is not None and third.snapshot_row == second.snapshot_row
    assert find(stems[1]) is None and find(stems[0]) is first
    assert cache.insert(stems[0], _digests(cache, stems[0]), held) is None  # cached already
    cache.clear()
    assert len(cache) == 0 and [blocks.ref_count(b) for b in held] == [1] * 4
    blocks.free(held)
    assert blocks.num_free_blocks == 16


def test_insert_needs_a_whole_number_of_checkpoints():
    cache = PrefixCache(BlockManager(16, 4), (10,), alignment=8)
    tokens = list(range(12))
    with pytest.raises(ValueError, match="multiple of 8"):
        cache.insert(tokens, _digests(cache, tokens), [0, 1, 2])
    with pytest.raises(ValueError, match="block size"):
        PrefixCache(BlockManager(16, 4), (10,), alignment=6)


def _scheduler(num_blocks=256, rows=SNAPSHOT_ROWS, **cfg):
    config = SchedulerConfig(
        **{
            "block_size": 4,
            "max_model_len": 1024,
            "max_num_batched_tokens": 512,
            "prefix_cache_snapshots": len(rows),
            "prefix_cache_min_tokens": 128,
            **cfg,
        }
    )
    outputs: dict[str, list[RequestOutput]] = {}
    sched = Scheduler(
        config,
        num_blocks=num_blocks,
        num_slots=8,
        snapshot_rows=rows,
        emit=lambda req, out: outputs.setdefault(req.request_id, []).append(out),
    )
    return sched, FakeRunner(num_blocks=num_blocks, snapshot_rows=rows), outputs


def _run(sched: Scheduler, runner: FakeRunner) -> list[ScheduledBatch]:
    batches = []
    while sched.has_work():
        batch = sched.schedule()
        batches.append(batch)
        sched.update(batch, runner.run(batch))
    return batches


GREEDY = SamplingParams(temperature=0.0, max_tokens=3)
STEM = [1 + i % 97 for i in range(300)]


def test_a_long_prompt_is_cut_at_its_checkpoint_and_a_later_one_starts_there():
    sched, runner, outputs = _scheduler()
    a = sched.add_request("a", STEM, GREEDY)
    batches = _run(sched, runner)
    # 300 tokens: the last checkpoint before the final token is 256 (a multiple of 128).
    assert [s.num_new_tokens for s in batches[0].seqs] == [256]
    assert batches[1].state_copies == ((0, 8),)  # a's row, right after the chunk that ended there
    assert len(sched.prefix) == 1 and outputs["a"][-1].num_cached_tokens == 0
    entry = sched.prefix.lookup(STEM, sched.prefix.digests(STEM, []))
    assert entry is not None
    cached_blocks = entry.blocks
    assert a.block_ids == [] and all(sched.blocks.ref_count(b) == 1 for b in cached_blocks)

    b = sched.add_request("b", [*STEM[:280], 5, 6, 7], GREEDY)
    first = sched.schedule()
    assert first.state_copies == ((8, b.state_slot),)  # the snapshot into b's own row
    assert [(s.num_cached_tokens, s.num_new_tokens) for s in first.seqs] == [(256, 27)]
    assert b.block_ids[:64] == list(cached_blocks)
    sched.update(first, runner.run(first))
    _run(sched, runner)
    assert outputs["b"][-1].num_cached_tokens == 256
    assert sched.stats().num_prefix_cached_tokens == 256
    # A prompt that runs < prefix_cache_min_tokens past the cached part takes no checkpoint.
    assert len(sched.prefix) == 1


def test_digests_computed_ahead_of_add_request_serve_the_lookup():
    """The engine computes a prompt's digests on the client's thread and hands them over."""
    sched, runner, _ = _scheduler()
    sched.add_request("a", STEM, GREEDY)
    _run(sched, runner)
    prompt = [*STEM[:280], 5, 6, 7]
    ahead = sched.prompt_digests(prompt)
    assert ahead == sched.prefix.digests(prompt, [])
    b = sched.add_request("b", prompt, GREEDY, prefix_digests=ahead)
    assert b.prefix_digests == ahead and b.prefix_digests is not ahead
    first = sched.schedule()
    assert [(s.num_cached_tokens, s.num_new_tokens) for s in first.seqs] == [(256, 27)]
    assert len(b.prefix_digests) == len(ahead)  # nothing left to compute
    off, _, _ = _scheduler(rows=())
    assert off.prompt_digests(prompt) == []


def test_requests_with_media_or_prompt_logprobs_take_no_part():
    sched, runner, _ = _scheduler()
    sched.add_request("a", STEM, GREEDY)
    _run(sched, runner)
    media = MultimodalInputs(torch.zeros(4, 8), ((1, 2, 2),), ("image",))
    sched.add_request("m", [*STEM, 9], GREEDY, multimodal=media)
    scoring = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0)
    sched.add_request("s", [*STEM, 9], scoring)
    batches = _run(sched, runner)
    assert all(s.num_cached_tokens == 0 for s in batches[0].seqs)
    assert all(not b.state_copies for b in batches) and len(sched.prefix) == 1


def test_cached_blocks_are_reclaimed_before_anyone_is_preempted():
    # 100 blocks of 4: one 300-token prompt's entry holds 64 of them.
    sched, runner, _ = _scheduler(num_blocks=100)
    sched.add_request("a", STEM, GREEDY)
    _run(sched, runner)
    assert len(sched.prefix) == 1
    sched.add_request("b", [7] * 300, GREEDY)  # needs 76 blocks: the entry has to go
    _run(sched, runner)
    stats = sched.stats()
    assert stats.num_preemptions == 0 and stats.num_failed == 0
    assert stats.num_prefix_cache_entries == 1  # b's own prefix replaced a's


def test_no_block_or_row_leaks_after_random_shared_prefixes_and_aborts():
    rng = random.Random(0)
    sched, runner, _ = _scheduler(num_blocks=300, rows=(8, 9, 10))
    stems = [[rng.randrange(1, 90) for _ in range(rng.randint(130, 400))] for _ in range(4)]
    live: list[str] = []
    for i in range(120):
        stem = rng.choice(stems)
        prompt = stem[: rng.randint(1, len(stem))] + [rng.randrange(1, 90) for _ in range(5)]
        sched.add_request(str(i), prompt, SamplingParams(max_tokens=rng.randint(1, 6)))
        live.append(str(i))
        for _ in range(rng.randint(0, 3)):
            if sched.has_work():
                batch = sched.schedule()
                sched.update(batch, runner.run(batch))
        if rng.random() < 0.2:
            sched.abort(rng.choice(live))
    _run(sched, runner)
    stats = sched.stats()
    assert stats.num_prefix_cached_tokens > 0 and stats.num_running == 0
    sched.prefix.clear()
    assert sched.blocks.num_free_blocks == 300 and sched.slots.num_free_slots == 8
    assert sorted(sched.prefix._free_rows) == [8, 9, 10]


@pytest.mark.parametrize("deterministic", [True, False])
def test_greedy_output_with_a_cached_prefix_equals_the_output_without(tiny_model, deterministic):
    """Tiny model (CPU): the second prompt resumes at the first one's 256-token checkpoint; its
    tokens equal the reference decode, and in the deterministic mode its logprobs equal those of
    the same run without the prefix cache bit for bit."""
    rng = random.Random(1)
    stem = [rng.randrange(250) for _ in range(300)]
    prompts = [stem, [*stem[:270], *(rng.randrange(250) for _ in range(30))]]
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1)

    def run(num_snapshots: int) -> tuple[list[list[int]], list[list[float]], int]:
        config = SchedulerConfig(
            block_size=16, max_model_len=512, max_num_batched_tokens=512,
            deterministic=deterministic, prefix_cache_snapshots=num_snapshots,
            prefix_cache_min_tokens=128,
        )  # fmt: skip
        runner = Runner(tiny_model, config)
        logprobs: dict[str, list[float]] = {}

        def emit(req, out):
            logprobs.setdefault(req.request_id, []).extend(lp.logprob for lp in out.logprobs)

        sched = Scheduler(
            config, num_blocks=runner.num_blocks, num_slots=runner.num_slots,
            snapshot_rows=runner.snapshot_rows, emit=emit,
        )  # fmt: skip
        tokens = []
        for i, prompt in enumerate(prompts):  # one after the other: the first fills the cache
            req = sched.add_request(str(i), prompt, params)
            while sched.has_work():
                batch = sched.schedule()
                sched.update(batch, runner.run(batch))
            assert req.error is None
            tokens.append(req.output_token_ids)
        num_cached = sched.stats().num_prefix_cached_tokens
        return tokens, [logprobs[str(i)] for i in range(len(prompts))], num_cached

    cached_tokens, cached_logprobs, num_cached = run(2)
    plain_tokens, plain_logprobs, _ = run(0)
    assert num_cached == 256
    assert cached_tokens == plain_tokens
    assert cached_tokens[1] == reference_greedy(tiny_model, prompts[1], 6)
    if deterministic:
        assert cached_logprobs == plain_logprobs


def test_snapshots_come_out_of_the_cache_budget_and_the_engine_uses_them(tiny_model):
    spec = tiny_model.cache_spec()
    config = SchedulerConfig(
        block_size=16, max_model_len=512, max_num_batched_tokens=512, max_num_seqs=4,
        prefix_cache_snapshots=3, prefix_cache_min_tokens=128,
    )  # fmt: skip
    budget = 20 * spec.state_bytes_per_slot()
    off = plan_cache(spec, replace(config, prefix_cache_snapshots=0), budget_bytes=budget,
                     cap_blocks=False)  # fmt: skip
    on = plan_cache(spec, config, budget_bytes=budget, cap_blocks=False)
    assert (on.num_slots, on.num_snapshots) == (off.num_slots, 3)
    block_bytes = spec.kv_bytes_per_token() * config.block_size
    rows_bytes = (on.num_slots + 3) * spec.state_bytes_per_slot()
    assert on.num_blocks == (budget - rows_bytes) // block_bytes < off.num_blocks
    engine = Engine.from_model(tiny_model, config)
    try:
        runner = engine.runner
        assert isinstance(runner, Runner)
        rows = list(runner.snapshot_rows)
        assert rows == [runner.num_slots + i for i in range(3)]
        assert next(iter(runner.caches.linear.values())).recurrent.shape[0] == runner.num_slots + 3
        rng = random.Random(2)
        stem = [rng.randrange(250) for _ in range(300)]
        first = engine.generate(stem, SamplingParams(temperature=0.0, max_tokens=4))
        again = engine.generate(stem, SamplingParams(temperature=0.0, max_tokens=4))
        assert first == again == reference_greedy(tiny_model, stem, 4)
        assert engine.stats().num_prefix_cached_tokens == 256
    finally:
        engine.shutdown()


def test_a_prompt_that_parts_from_a_cached_one_caches_the_shared_part_for_a_third():
    sched, runner, outputs = _scheduler(rows=(8, 9, 10))
    system = STEM[:260]
    questions = [[90 + i] * 150 for i in range(3)]
    sched.add_request("a", [*system, *questions[0]], GREEDY)  # 410 tokens: checkpoint at 384
    _run(sched, runner)
    sched.add_request("b", [*system, *questions[1]], GREEDY)
    batches = _run(sched, runner)
    # b shares 256 aligned tokens with a's entry but no snapshot ends there: it cuts there too.
    assert [s.num_new_tokens for s in batches[0].seqs] == [256]
    assert [s.num_new_tokens for s in batches[1].seqs] == [128]
    assert len(sched.prefix) == 3
    sched.add_request("c", [*system, *questions[2]], GREEDY)
    _run(sched, runner)
    assert outputs["c"][-1].num_cached_tokens == 256


@pytest.mark.gpu
def test_a_cached_prefix_gives_the_bits_of_a_cut_there_on_cuda():
    """On the device (bf16, CUDA graphs, deterministic): a prompt resumed from a snapshot at 256
    tokens gives the tokens and logprobs of the same prompt run without the prefix cache."""
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    rng = random.Random(3)
    stem = [rng.randrange(250) for _ in range(300)]
    prompts = [stem, [*stem[:290], *(rng.randrange(250) for _ in range(20))]]
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1)

    def run(num_snapshots: int) -> tuple[list[list[int]], list[list[float]]]:
        config = SchedulerConfig(
            block_size=16, max_model_len=512, max_num_seqs=4, max_num_batched_tokens=512,
            deterministic=True, prefix_cache_snapshots=num_snapshots, prefix_cache_min_tokens=128,
        )  # fmt: skip
        engine = Engine.from_model(model, config)
        try:
            tokens, logprobs = [], []
            for prompt in prompts:
                outs: list[RequestOutput] = []
                done = threading.Event()

                def on_output(out, outs=outs, done=done):
                    outs.append(out)
                    if out.is_finished:
                        done.set()

                engine.add_request(f"r{len(tokens)}", prompt, params, on_output=on_output)
                assert done.wait(120)
                tokens.append([t for o in outs for t in o.new_token_ids])
                logprobs.append([lp.logprob for o in outs for lp in o.logprobs])
            assert engine.stats().num_prefix_cached_tokens == (256 if num_snapshots else 0)
            return tokens, logprobs
        finally:
            engine.shutdown()

    assert run(2) == run(0)
