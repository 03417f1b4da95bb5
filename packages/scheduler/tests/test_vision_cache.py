"""Media reuse (CPU): the tower-output cache and prompts with media in the prefix cache."""

from __future__ import annotations

import hashlib

import pytest
import torch
from sparkinfer.model.mrope import get_rope_positions
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.errors import InvalidRequest
from sparkinfer.scheduler.prefix_cache import media_key_tokens
from sparkinfer.scheduler.request import MultimodalInputs
from sparkinfer.scheduler.vision.cache import VisionCache
from test_vision_inputs import (  # the tiny multimodal model and its direct-model reference
    END,
    GREEDY,
    IMAGE,
    START,
    config,
    mm_model,  # noqa: F401 (a fixture)
    reference_greedy,
    run_engine,
)

GRID = (1, 8, 8)  # 16 pad tokens
HEAD_LEN = 5  # text before the image block


def image_prompt(image_seed: int, tail_seed: int) -> tuple[list[int], MultimodalInputs]:
    """Text, one image, then text past the first 128-token checkpoint; the image's pixels and
    content hash come from `image_seed`, the text after the checkpoint from `tail_seed`."""
    ids = [*range(1, 1 + HEAD_LEN), START, *[IMAGE] * 16, END, *range(30, 140)]
    ids += torch.randint(0, 200, (12,), generator=torch.Generator().manual_seed(tail_seed)).tolist()
    pixels = torch.randn(64, 1536, generator=torch.Generator().manual_seed(image_seed))
    rope = get_rope_positions(ids, [GRID], [], image_token_id=IMAGE, video_token_id=IMAGE + 1)
    start, content_hash = HEAD_LEN + 1, hashlib.sha256(bytes([image_seed])).hexdigest()
    return ids, MultimodalInputs(
        pixels, (GRID,), ("image",), rope.positions, rope.rope_delta,
        content_hashes=(content_hash,), pad_runs=((start, start + 16, 0),),
    )  # fmt: skip


def test_cache_is_least_recently_used_within_its_bytes() -> None:
    cache = VisionCache(max_bytes=3 * 64)  # three float32 rows of 16
    for name in "abc":
        cache.put(name, torch.zeros(1, 16))
    assert cache.get("a") is not None  # a is now the most recent: b goes first
    cache.put("d", torch.zeros(1, 16))
    assert cache.get("b") is None and len(cache) == 3 and cache.num_bytes == 192
    cache.put("huge", torch.zeros(4, 16))  # larger than the budget: not kept, nothing evicted
    assert cache.get("huge") is None and len(cache) == 3
    with pytest.raises(ValueError, match="expected >= 0"):
        VisionCache(-1)


def test_media_keys_tell_images_with_the_same_pads_apart() -> None:
    ids, mm = image_prompt(1, 0)
    _, other = image_prompt(2, 0)
    same = media_key_tokens(ids, mm.content_hashes, mm.pad_runs)
    assert same == media_key_tokens(ids, mm.content_hashes, mm.pad_runs)
    differ = media_key_tokens(ids, other.content_hashes, other.pad_runs)
    assert same != differ and same[:HEAD_LEN] == differ[:HEAD_LEN]
    assert all(k < 0 for k in same[HEAD_LEN + 1 : HEAD_LEN + 17])  # never a token id
    assert IMAGE not in same


def test_second_turn_reuses_prefix_and_rows_with_cold_tokens(mm_model) -> None:  # noqa: F811
    """The same image again: its prefix is a hit and its rows come from the cache, and the tokens
    are the cold direct model's; another image with the same pad ids is no hit."""
    first, again, other = image_prompt(1, 0), image_prompt(1, 1), image_prompt(2, 1)
    engine = Engine.from_model(
        mm_model, config(max_model_len=256, prefix_cache_min_tokens=1, num_kv_blocks=40)
    )
    try:
        assert run_engine(engine, [first]) == [reference_greedy(mm_model, *first)]
        assert len(engine.runner.vision.cache) == 1
        assert run_engine(engine, [again]) == [reference_greedy(mm_model, *again)]
        assert engine.stats().num_prefix_cached_tokens == 128  # the image lies in the prefix
        assert run_engine(engine, [other]) == [reference_greedy(mm_model, *other)]
        assert engine.stats().num_prefix_cached_tokens == 128  # another image: no hit
        assert len(engine.runner.vision.cache) == 2
    finally:
        engine.shutdown()


def test_cached_rows_equal_cold_rows(mm_model) -> None:  # noqa: F811
    """With the prefix cache off, a second request for the same image takes the tower's rows
    from the cache, and its tokens are those of a cold engine with no cache at all."""
    ids, mm = image_prompt(3, 0)
    cold = Engine.from_model(mm_model, config(max_model_len=256, vision_cache_bytes=0))
    warm = Engine.from_model(
        mm_model, config(max_model_len=256, prefix_cache_snapshots=0, num_kv_blocks=40)
    )
    try:
        want = run_engine(cold, [(ids, mm)])
        assert len(cold.runner.vision.cache) == 0
        assert run_engine(warm, [(ids, mm)]) == want
        cached = warm.runner.vision.cache.get(mm.content_hashes[0])
        assert cached is not None and cached.shape[0] == 16
        assert run_engine(warm, [(ids, mm)]) == want  # from the cache this time
    finally:
        cold.shutdown()
        warm.shutdown()


def test_wrong_pad_runs_are_refused(mm_model) -> None:  # noqa: F811
    ids, mm = image_prompt(1, 0)
    engine = Engine.from_model(mm_model, config(max_model_len=256, num_kv_blocks=40))
    try:
        for runs in (((0, 16, 0),), ((HEAD_LEN + 1, HEAD_LEN + 9, 0),)):
            bad = MultimodalInputs(
                mm.pixel_values, mm.grid_thw, mm.kinds, mm.positions, mm.rope_delta,
                content_hashes=mm.content_hashes, pad_runs=runs,
            )  # fmt: skip
            with pytest.raises(InvalidRequest, match="pad run"):
                engine.add_request("bad", ids, GREEDY, on_output=None, multimodal=bad)
        assert len(engine.runner.vision.cache) == 0
    finally:
        engine.shutdown()


def test_one_tower_call_per_step_and_an_item_once(mm_model, monkeypatch) -> None:  # noqa: F811
    """Three requests start their prompts in one step, two with the same image: the tower runs
    once, on two items; the shared image's rows are the same for both."""
    from sparkinfer.scheduler.batch import ScheduledSeq
    from sparkinfer.scheduler.request import Request
    from sparkinfer.scheduler.vision.inputs import VisionInputs

    assert mm_model.visual is not None
    calls: list[int] = []
    tower = mm_model.visual.forward
    monkeypatch.setattr(
        mm_model.visual, "forward", lambda px, grids: calls.append(len(grids)) or tower(px, grids)
    )
    vision = VisionInputs(mm_model, torch.device("cpu"), cache_bytes=1 << 20)
    reqs = [
        Request(f"r{i}", ids, GREEDY, max_len=256, multimodal=mm)
        for i, (ids, mm) in enumerate([image_prompt(4, 0), image_prompt(4, 1), image_prompt(5, 0)])
    ]
    vision.prepare([ScheduledSeq(req, 0, 32) for req in reqs])
    assert calls == [2] and len(vision.cache) == 2
    rows = [vision._rows[req.request_id].rows for req in reqs]
    assert torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], rows[2])
