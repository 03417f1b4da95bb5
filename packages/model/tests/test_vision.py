"""The vision tower against transformers' Qwen3_5VisionModel on a small random checkpoint."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sparkinfer.model.config import parse_vision_config
from sparkinfer.model.errors import CheckpointError, UnsupportedCheckpoint
from sparkinfer.model.vision import (
    VisionModel,
    merge_vision_embeddings,
    patch_positions,
    pos_embed_taps,
)

# real patch geometry (16 px, 2 frames, 2x2 merge: 1536-value patches), tiny widths; an 8x8
# position grid so that small images interpolate it down and larger ones up
VISION = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "out_hidden_size": 24,
    "num_position_embeddings": 64,
}
TEXT = {
    "vocab_size": 64,
    "hidden_size": 24,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "layer_types": ["full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 12,
}
# images and videos of mixed shapes in one call: (1, h, w) images, (t, h, w) videos
GRIDS = [(1, 4, 6), (3, 4, 4), (1, 12, 2), (1, 2, 2), (2, 10, 14)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=TEXT, vision_config=VISION))
    with torch.no_grad():  # non-default norms and biases, so every parameter matters
        for name, p in model.model.visual.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape))
    path = tmp_path_factory.mktemp("vl")
    model.save_pretrained(path)
    return path, model.eval()


def load_tower(path: Path, dtype: torch.dtype = torch.float32) -> VisionModel:
    config = parse_vision_config(json.loads((path / "config.json").read_text())["vision_config"])
    tower = VisionModel(config, dtype=dtype)
    tensors = load_file(str(path / "model.safetensors"))
    tower.load_weights((k, v) for k, v in tensors.items() if k.startswith("model.visual."))
    return tower


def random_pixels(grids: list[tuple[int, int, int]], seed: int = 0) -> torch.Tensor:
    n = sum(t * h * w for t, h, w in grids)
    return torch.randn(n, 1536, generator=torch.Generator().manual_seed(seed))


def test_vision_matches_transformers(checkpoint) -> None:
    path, hf = checkpoint
    tower = load_tower(path)
    pixels = random_pixels(GRIDS)
    got = tower(pixels, GRIDS)
    with torch.no_grad():
        want = hf.model.visual(pixels, grid_thw=torch.tensor(GRIDS)).pooler_output
    assert got.shape == (sum(t * h * w for t, h, w in GRIDS) // 4, 24)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


def test_vision_items_are_independent(checkpoint) -> None:
    """Each image or frame group attends only within itself: a batch equals its items alone."""
    tower = load_tower(checkpoint[0])
    pixels = random_pixels(GRIDS, seed=1)
    batched = tower(pixels, GRIDS)
    rows, outs = 0, []
    for grid in GRIDS:
        n = grid[0] * grid[1] * grid[2]
        outs.append(tower(pixels[rows : rows + n], [grid]))
        rows += n
    torch.testing.assert_close(batched, torch.cat(outs), atol=1e-5, rtol=1e-5)


def test_vision_bf16_close_to_fp32(checkpoint) -> None:
    path, _ = checkpoint
    pixels = random_pixels(GRIDS[:2])
    ref = load_tower(path)(pixels, GRIDS[:2])
    got = load_tower(path, torch.bfloat16)(pixels, GRIDS[:2])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, atol=0.05, rtol=0.05)


def test_vision_position_helpers_match_transformers() -> None:
    from transformers.vision_utils import (
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
    )

    grid = torch.tensor(GRIDS)
    assert torch.equal(patch_positions(GRIDS, 2), get_vision_position_ids(grid, 2))
    idx, w = pos_embed_taps(GRIDS, 8, 2)
    want_idx, want_w = get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=8, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    # identical sampling, where the taps may differ only where their weight is 0
    table = torch.randn(64, 5)
    torch.testing.assert_close(
        (table[idx] * w[..., None]).sum(1), (table[want_idx] * want_w[..., None]).sum(1)
    )


def test_vision_load_rejects_bad_tensors(checkpoint) -> None:
    path, _ = checkpoint
    config = parse_vision_config(json.loads((path / "config.json").read_text())["vision_config"])
    tensors = {k: v for k, v in load_file(str(path / "model.safetensors")).items() if "visual" in k}
    tower = VisionModel(config)
    missing = dict(tensors)
    missing.pop("model.visual.merger.norm.bias")
    with pytest.raises(CheckpointError, match=r"missing, e\.g\. model\.visual\.merger\.norm\.bias"):
        tower.load_weights(missing.items())
    with pytest.raises(CheckpointError, match="not a vision tower parameter"):
        tower.load_weights([*tensors.items(), ("model.visual.blocks.9.attn.qkv.weight", 0)])
    wrong = {**tensors, "model.visual.pos_embed.weight": torch.zeros(16, 32)}
    with pytest.raises(
        CheckpointError, match=r"shape \(16, 32\); vision_config expects \(64, 32\)"
    ):
        tower.load_weights(wrong.items())


def test_vision_rejects_unsupported_config() -> None:
    config = parse_vision_config({**VISION, "model_type": "qwen3_5"})
    with pytest.raises(UnsupportedCheckpoint, match="deepstack"):
        VisionModel(dataclasses.replace(config, deepstack_visual_indexes=(1,)))
    with pytest.raises(UnsupportedCheckpoint, match="hidden_act"):
        VisionModel(dataclasses.replace(config, hidden_act="relu"))


def test_vision_rejects_bad_input(checkpoint) -> None:
    tower = load_tower(checkpoint[0])
    with pytest.raises(ValueError, match=r"needs \[16, 1536\]"):
        tower(torch.zeros(15, 1536), [(1, 4, 4)])
    with pytest.raises(ValueError, match="multiples of 2"):
        tower(torch.zeros(12, 1536), [(1, 3, 4)])


def test_merge_vision_embeddings_fills_pad_rows_in_order() -> None:
    embeds = torch.zeros(6, 3)
    is_vision = torch.tensor([False, True, True, False, True, False])
    rows = torch.arange(9.0).view(3, 3)
    out = merge_vision_embeddings(embeds, is_vision, rows)
    assert torch.equal(out[is_vision], rows)
    assert torch.equal(out[~is_vision], torch.zeros(3, 3))
    with pytest.raises(ValueError, match="3 vision pad tokens but 2"):
        merge_vision_embeddings(embeds, is_vision, rows[:2])


def test_segment_attention_has_its_reference_signature_and_result_on_cpu() -> None:
    from sparkinfer.model.vision import segment_attention, segment_attention_ref

    assert inspect.signature(segment_attention) == inspect.signature(segment_attention_ref)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(10, 2, 8, generator=gen) for _ in range(3))
    got = segment_attention(q, k, v, [4, 6], scale=8**-0.5)
    assert torch.equal(got, segment_attention_ref(q, k, v, [4, 6], scale=8**-0.5))
    alone = torch.nn.functional.scaled_dot_product_attention(
        q[4:].transpose(0, 1), k[4:].transpose(0, 1), v[4:].transpose(0, 1), scale=8**-0.5
    )
    torch.testing.assert_close(got[4:], alone.transpose(0, 1))  # segments do not see each other


def test_equal_segments_run_as_one_batched_call_with_the_reference_result() -> None:
    """Frame groups of one video (equal lengths) batch into one SDPA call over segments."""
    from sparkinfer.model.vision import segment_attention, segment_attention_ref

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(18, 2, 8, generator=gen) for _ in range(3))
    for seg_lens in ([18], [6, 6, 6]):
        got = segment_attention(q, k, v, seg_lens, scale=8**-0.5)
        want = segment_attention_ref(q, k, v, seg_lens, scale=8**-0.5)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("seg_lens", [[64], [100, 100, 100], [16, 256, 36, 36], [1, 7, 300]])
def test_packed_segment_attention_matches_the_reference_on_gpu(seg_lens: list[int]) -> None:
    """One launch for every segment (batched for equal lengths, varlen else) equals the
    per-segment SDPA loop (bf16)."""
    from sparkinfer.model.vision import _varlen_attn, segment_attention, segment_attention_ref

    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (sum(seg_lens), 4, 72)  # the 27B tower's head dim
    q, k, v = (
        torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3)
    )
    got = segment_attention(q, k, v, seg_lens, scale=72**-0.5)
    want = segment_attention_ref(q, k, v, seg_lens, scale=72**-0.5)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    varlen = _varlen_attn()  # the packed path itself runs here (no fallback to the loop)
    assert varlen is not None, "this torch has no torch.nn.attention.varlen"
    cu = torch.tensor([0, *seg_lens], device="cuda").cumsum(0, dtype=torch.int32)
    packed = varlen(q, k, v, cu, cu, max(seg_lens), max(seg_lens))
    torch.testing.assert_close(packed, want, atol=2e-2, rtol=2e-2)
