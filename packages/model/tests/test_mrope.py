"""MRoPE positions against transformers' Qwen3_5Model.get_rope_index, and model.md §9 examples."""

from __future__ import annotations

import pytest
import torch
from sparkinfer.model.mrope import get_rope_positions, text_positions

IMAGE, VIDEO, START, END = 248056, 248057, 248053, 248054
IDS = {"image_token_id": IMAGE, "video_token_id": VIDEO}


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen3_5Config, Qwen3_5Model

    text = {
        "vocab_size": 64,
        "hidden_size": 16,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "layer_types": ["full_attention"],
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
    }
    vision = {"depth": 1, "hidden_size": 8, "intermediate_size": 8, "num_heads": 2}
    return Qwen3_5Model(Qwen3_5Config(text_config=text, vision_config=vision)).eval()


def image_block(grid: tuple[int, int, int]) -> list[int]:
    t, h, w = grid
    return [START, *[IMAGE] * (t * h * w // 4), END]


def video_block(grid: tuple[int, int, int], stamp_len: int = 6) -> list[int]:
    t, h, w = grid
    out: list[int] = []
    for g in range(t):
        out += [100 + g] * stamp_len + [START, *[VIDEO] * (h * w // 4), END]
    return out


def hf_positions(model, ids: list[int], images, videos) -> tuple[torch.Tensor, int]:
    input_ids = torch.tensor([ids])
    types = torch.where(input_ids == IMAGE, 1, torch.where(input_ids == VIDEO, 2, 0))
    pos, delta = model.get_rope_index(
        input_ids,
        mm_token_type_ids=types,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return pos[:, 0], int(delta)


CASES = {
    "text_only": ([1, 2, 3, 4, 5], [], []),
    "one_image": ([7, 8, *image_block((1, 28, 28)), 9, 10], [(1, 28, 28)], []),
    "wide_and_tall": (
        [1, *image_block((1, 4, 84)), 2, 3, *image_block((1, 70, 4)), 4],
        [(1, 4, 84), (1, 70, 4)],
        [],
    ),
    "video": ([5, 6, *video_block((6, 28, 28)), 7], [], [(6, 28, 28)]),
    "mixed": (
        [
            1,
            *video_block((2, 4, 6)),
            2,
            *image_block((1, 8, 4)),
            *video_block((3, 6, 4), stamp_len=7),
            3,
            4,
        ],
        [(1, 8, 4)],
        [(2, 4, 6), (3, 6, 4)],
    ),
    "media_at_edges": (
        [*image_block((1, 2, 2)), 1, *image_block((1, 4, 2))],
        [(1, 2, 2), (1, 4, 2)],
        [],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_rope_positions_match_transformers(hf_model, case: str) -> None:
    ids, images, videos = CASES[case]
    got = get_rope_positions(ids, images, videos, **IDS)
    want, want_delta = hf_positions(hf_model, ids, images, videos)
    assert torch.equal(got.positions, want)
    assert got.rope_delta == want_delta


def test_rope_positions_image_worked_example() -> None:
    """model.md §9 example 1: 196 pads at (q+1, q+1+r, q+1+c), vision_end at q+15: 16 positions."""
    q = 2
    ids = [7, 8, *image_block((1, 28, 28)), 9]
    pos, delta = get_rope_positions(ids, [(1, 28, 28)], [], **IDS)
    pads = pos[:, q + 1 : q + 197]
    assert torch.equal(pads[0], torch.full((196,), q + 1))
    assert torch.equal(pads[1].view(14, 14), (q + 1 + torch.arange(14)).view(14, 1).expand(14, 14))
    assert torch.equal(pads[2].view(14, 14), (q + 1 + torch.arange(14)).expand(14, 14))
    assert pos[:, q + 197].tolist() == [q + 15] * 3  # vision_end
    assert pos[:, -1].tolist() == [q + 16] * 3
    assert delta == (q + 16 + 1) - len(ids)


def test_rope_positions_video_worked_example() -> None:
    """model.md §9 example 2: 6 groups of (6 + 1 + 196 + 1) tokens use 6 x 22 = 132 positions."""
    ids = video_block((6, 28, 28))
    assert len(ids) == 1224
    pos, delta = get_rope_positions(ids, [], [(6, 28, 28)], **IDS)
    assert int(pos.max()) + 1 == 132
    assert delta == 132 - 1224
    # every group restarts t at its own start position: temporal order comes from the text
    group_starts = [int(pos[0, g * 204 + 7]) for g in range(6)]
    assert group_starts == [7 + 22 * g for g in range(6)]


def test_decode_positions_continue_from_delta(hf_model) -> None:
    ids = [1, 2, *image_block((1, 8, 12)), 3]
    pos, delta = get_rope_positions(ids, [(1, 8, 12)], [], **IDS)
    nxt = text_positions(len(ids), 3, delta)
    assert nxt.shape == (3, 3)
    assert nxt[:, 0].tolist() == [int(pos.max()) + 1] * 3
    # transformers: arange(cache_length, cache_length + n) + rope_deltas on every axis
    _, want_delta = hf_positions(hf_model, ids, [(1, 8, 12)], [])
    assert torch.equal(nxt, (torch.arange(len(ids), len(ids) + 3) + want_delta).expand(3, -1))


def test_rope_positions_accept_tensor_ids() -> None:
    ids = [1, *image_block((1, 4, 4)), 2]
    a = get_rope_positions(torch.tensor(ids), [torch.tensor([1, 4, 4])], [], **IDS)
    b = get_rope_positions(ids, [(1, 4, 4)], [], **IDS)
    assert torch.equal(a.positions, b.positions) and a.rope_delta == b.rope_delta


@pytest.mark.parametrize(
    ("ids", "images", "videos", "match"),
    [
        ([1, *image_block((1, 4, 4))], [(1, 4, 6)], [], "6 pad tokens"),
        ([1, *image_block((1, 4, 4))], [], [], "no image grid left"),
        ([1, 2], [(1, 4, 4)], [], "image 0 has no pad tokens"),
        (video_block((2, 4, 4)), [], [(3, 4, 4)], "video 0 has no pad tokens"),
        (video_block((2, 4, 4)), [], [(1, 4, 4)], "no video grid left"),
    ],
)
def test_rope_positions_reject_mismatched_grids(ids, images, videos, match) -> None:
    with pytest.raises(ValueError, match=match):
        get_rope_positions(ids, images, videos, **IDS)
