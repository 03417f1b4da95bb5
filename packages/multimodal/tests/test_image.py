"""Images against transformers' Qwen2VLImageProcessor (the checkpoint's Fast processor)."""

from __future__ import annotations

import io
import random
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from sparkinfer.multimodal.data_url import MediaLimits
from sparkinfer.multimodal.errors import MediaError, MediaTooLarge, UndecodableMedia
from sparkinfer.multimodal.image import (
    ImageConfig,
    PatchConfig,
    decode_image,
    image_to_patches,
    patchify,
    smart_resize,
)

PATCH = PatchConfig()
LIMITS = MediaLimits()


def hf_processor(config: ImageConfig):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(
        size={"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )


@pytest.mark.parametrize(
    ("size", "mode", "fmt"),
    [
        ((7, 5), "RGB", "PNG"),  # tiny: scaled up to the 65,536-pixel minimum
        ((1000, 37), "RGB", "PNG"),  # wide
        ((37, 700), "RGB", "PNG"),  # tall
        ((448, 448), "RGB", "PNG"),  # docs/model.md §9, example 1
        ((333, 517), "RGB", "JPEG"),  # not multiples of 32
        ((300, 200), "RGBA", "PNG"),  # alpha composited on white
        ((64, 300), "P", "GIF"),  # palette
    ],
)
def test_image_matches_transformers(image_bytes, size, mode, fmt) -> None:
    config = ImageConfig()
    data = image_bytes(*size, mode=mode, fmt=fmt)
    patches = image_to_patches(
        decode_image(data, field="f", limits=LIMITS), patch=PATCH, config=config
    )
    want = hf_processor(config)(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
    assert patches.grid_thw == tuple(want["image_grid_thw"][0].tolist())
    assert patches.pixel_values.dtype == torch.float32
    assert torch.equal(patches.pixel_values, want["pixel_values"])


def test_image_downscaled_to_max_pixels_matches_transformers(image_bytes) -> None:
    config = ImageConfig(min_pixels=32 * 32, max_pixels=128 * 128)
    data = image_bytes(500, 260)
    patches = image_to_patches(
        decode_image(data, field="f", limits=LIMITS), patch=PATCH, config=config
    )
    want = hf_processor(config)(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
    assert patches.grid_thw == tuple(want["image_grid_thw"][0].tolist()) == (1, 4, 10)
    assert torch.equal(patches.pixel_values, want["pixel_values"])


def test_image_worked_example_token_count(image_bytes) -> None:
    """448x448 -> grid (1, 28, 28): 784 patches, 196 tokens (docs/model.md §9 example 1)."""
    image = decode_image(image_bytes(448, 448), field="f", limits=LIMITS)
    patches = image_to_patches(image, patch=PATCH, config=ImageConfig())
    assert patches.grid_thw == (1, 28, 28)
    assert patches.pixel_values.shape == (784, 1536)


def test_smart_resize_matches_transformers() -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_resize

    rng = random.Random(0)
    sizes = [(1, 1), (16, 16), (4096, 4096), (5000, 3000), (10, 1999), (256, 256)]
    sizes += [(rng.randint(1, 6000), rng.randint(1, 6000)) for _ in range(300)]
    for h, w in sizes:
        if max(h, w) / min(h, w) > 200:
            continue
        got = smart_resize(h, w, factor=32, min_pixels=65_536, max_pixels=16_777_216)
        assert got == hf_resize(h, w, factor=32, min_pixels=65_536, max_pixels=16_777_216)
        assert got[0] % 32 == 0 and got[1] % 32 == 0
        assert 65_536 <= got[0] * got[1] <= 16_777_216


def test_patchify_merge_block_order() -> None:
    """Patch k of a 2x2 merge block is (block row, block col, in-row, in-col) in row-major order."""
    frames = torch.zeros(2, 3, 64, 64, dtype=torch.uint8)
    for r in range(4):
        for c in range(4):
            frames[:, 0, r * 16 : (r + 1) * 16, c * 16 : (c + 1) * 16] = r * 4 + c
    frames[1, 1] = 255  # second frame differs in channel 1 only
    patches = patchify(frames, PATCH)
    assert patches.grid_thw == (1, 4, 4)
    raster = (patches.pixel_values[:, 0] * 127.5 + 127.5).round().long().tolist()
    assert raster == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    vec = patches.pixel_values[0].view(3, 2, 16, 16)  # (channel, temporal, py, px)
    assert torch.all(vec[1, 0] == -1) and torch.all(vec[1, 1] == 1)


def test_image_rejects_corrupt_bytes() -> None:
    with pytest.raises(UndecodableMedia, match=r"^f is not a readable"):
        decode_image(b"\x89PNG\r\n\x1a\n" + bytes(range(200)), field="f", limits=LIMITS)


def test_image_rejects_truncated_file(image_bytes) -> None:
    data = image_bytes(200, 200)
    with pytest.raises(UndecodableMedia, match="corrupt or truncated"):
        decode_image(data[: len(data) // 2], field="f", limits=LIMITS)


def test_image_rejects_formats_outside_the_allow_list() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (40, 40)).save(buf, format="TIFF")
    with pytest.raises(UndecodableMedia, match="PNG/WEBP"):
        decode_image(buf.getvalue(), field="f", limits=LIMITS)


def test_image_rejects_too_many_pixels_before_decoding(image_bytes) -> None:
    with pytest.raises(MediaTooLarge, match=r"100x80 image \(8000 pixels\); the limit is 5000"):
        decode_image(image_bytes(100, 80), field="f", limits=MediaLimits(max_image_pixels=5000))


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10))


@pytest.mark.parametrize("side", [20_000, 60_000])
def test_image_rejects_decompression_bomb_from_header(side: int) -> None:
    """A 100-byte file claiming side x side pixels is refused without allocating them."""
    with pytest.raises(MediaTooLarge, match="smaller image"):
        decode_image(_png_header_only(side, side), field="f", limits=LIMITS)


def test_image_rejects_extreme_aspect_ratio(image_bytes) -> None:
    image = decode_image(image_bytes(1005, 5), field="f", limits=LIMITS)
    with pytest.raises(MediaError, match="aspect ratio above 200"):
        image_to_patches(image, patch=PATCH, config=ImageConfig(), field="f")


def test_decode_image_returns_rgb_uint8_chw(image_bytes) -> None:
    image = decode_image(image_bytes(30, 20, mode="RGBA"), field="f", limits=LIMITS)
    assert image.shape == (3, 20, 30) and image.dtype == torch.uint8 and image.is_contiguous()
    rgba = np.asarray(Image.open(io.BytesIO(image_bytes(30, 20, mode="RGBA"))))
    alpha = rgba[..., 3:].astype(np.float64) / 255
    blended = rgba[..., :3] * alpha + 255 * (1 - alpha)
    assert np.abs(image.permute(1, 2, 0).numpy() - blended).max() <= 1


def _patchify_reference(frames: torch.Tensor, patch: PatchConfig) -> torch.Tensor:
    """The patch rule spelled out: normalise in float32, pad T, one permute, one reshape."""
    mean = torch.tensor(patch.image_mean) * (1.0 / patch.rescale_factor)
    std = torch.tensor(patch.image_std) * (1.0 / patch.rescale_factor)
    x = (frames.to(torch.float32) - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    if pad := -x.shape[0] % patch.temporal_patch_size:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)])
    p, tp, m = patch.patch_size, patch.temporal_patch_size, patch.merge_size
    gt, gh, gw = x.shape[0] // tp, x.shape[2] // p, x.shape[3] // p
    x = x.view(gt, tp, 3, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, patch.patch_dim)


@pytest.mark.parametrize("num_frames", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "patch", [PATCH, PatchConfig(image_mean=(0.48, 0.46, 0.41), image_std=(0.27, 0.26, 0.28))]
)
def test_patchify_is_bit_identical_to_the_reference_rule(num_frames, patch) -> None:
    frames = torch.randint(0, 256, (num_frames, 3, 64, 96), dtype=torch.uint8)
    got = patchify(frames, patch).pixel_values
    assert got.is_contiguous() and got.dtype == torch.float32
    assert torch.equal(got, _patchify_reference(frames, patch))
    expanded = frames[:1].expand(2, -1, -1, -1)  # an image: one frame seen twice, no copy
    assert torch.equal(patchify(expanded, patch).pixel_values, _patchify_reference(expanded, patch))
