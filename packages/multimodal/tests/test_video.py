"""Video against transformers' Qwen3VLVideoProcessor: sampling, resize, patches, refusals."""

from __future__ import annotations

import itertools
from functools import partial
from pathlib import Path

import pytest
import torch
from sparkinfer.multimodal import video as video_module
from sparkinfer.multimodal.data_url import MediaLimits
from sparkinfer.multimodal.errors import MediaTooLarge, UndecodableMedia, VideoUnavailable
from sparkinfer.multimodal.image import PatchConfig
from sparkinfer.multimodal.video import (
    VideoConfig,
    decode_video,
    group_timestamps,
    sample_frame_indices,
    video_smart_resize,
    video_to_patches,
)

PATCH = PatchConfig()
CONFIG = VideoConfig()
LIMITS = MediaLimits()


def decode(data: bytes, mime: str = "video/mp4", **kw):
    limits = kw.pop("limits", LIMITS)
    config = kw.pop("config", CONFIG)
    return decode_video(data, mime, field="v", patch=PATCH, config=config, limits=limits)


def hf_reference(data: bytes, tmp_path: Path, config: VideoConfig = CONFIG):
    """transformers' own pipeline: PyAV decode + Qwen3VLVideoProcessor + Qwen3VLProcessor stamps."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import load_video

    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    proc = Qwen3VLVideoProcessor(
        size={"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels},
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        min_frames=config.min_frames,
        max_frames=config.max_frames,
        max_video_tokens=config.max_tokens_per_frame,
    )
    frames, meta = load_video(
        str(path), backend="pyav", sample_indices_fn=partial(proc.sample_frames, fps=config.fps)
    )
    out = proc(
        videos=[frames],
        video_metadata=[meta],
        do_sample_frames=False,
        cap_pixels_per_frame=config.cap_pixels_per_frame,
        return_tensors="pt",
    )
    stamps = Qwen3VLProcessor._calculate_timestamps(None, list(meta.frames_indices), meta.fps, 2)
    return meta, out, stamps


@pytest.mark.parametrize(
    ("seconds", "fps", "width", "height", "num_frames"),
    [
        (1, 30, 64, 64, 4),  # short: min_frames applies
        (6, 30, 100, 50, 12),  # 2 fps; 100x50 resized to a multiple of 32
        (300, 4, 40, 24, 32),  # 5 minutes: 32 frames spread over the whole clip
        (0.6, 5, 64, 32, 3),  # 3 frames: odd count, last frame repeated
    ],
)
def test_video_matches_transformers(clip_bytes, tmp_path, seconds, fps, width, height, num_frames):
    data = clip_bytes(seconds, fps, width, height)
    video = decode(data)
    patches = video_to_patches(video, PATCH)
    meta, want, want_stamps = hf_reference(data, tmp_path)
    assert list(video.frame_indices) == [int(i) for i in meta.frames_indices]
    assert len(video.frame_indices) == num_frames
    assert video.total_frames == meta.total_num_frames and video.source_fps == meta.fps
    assert patches.grid_thw == tuple(want["video_grid_thw"][0].tolist())
    assert torch.equal(patches.pixel_values, want["pixel_values_videos"])
    stamps = group_timestamps(video.frame_indices, video.source_fps)
    assert stamps == pytest.approx(want_stamps)


def test_video_without_pixel_cap_matches_transformers(clip_bytes, tmp_path) -> None:
    config = VideoConfig(cap_pixels_per_frame=False, max_pixels=64 * 64 * 4)
    data = clip_bytes(2, 10, 160, 96)
    patches = video_to_patches(decode(data, config=config), PATCH)
    _, want, _ = hf_reference(data, tmp_path, config)
    assert patches.grid_thw == tuple(want["video_grid_thw"][0].tolist())
    assert torch.equal(patches.pixel_values, want["pixel_values_videos"])


def test_sample_frame_indices_worked_example() -> None:
    """docs/model.md §9 example 2: 180 frames at 30 fps -> 12 frames."""
    assert sample_frame_indices(180, 30.0, CONFIG) == [
        0,
        16,
        33,
        49,
        65,
        81,
        98,
        114,
        130,
        146,
        163,
        179,
    ]


@pytest.mark.parametrize("total", [900, 9_000, 36_000, 123_457])
def test_sample_frame_indices_long_clip_spans_start_to_end(total: int) -> None:
    indices = sample_frame_indices(total, 30.0, CONFIG)
    assert len(indices) == 32
    assert indices[0] == 0 and indices[-1] == total - 1  # the last second is always represented
    gaps = [b - a for a, b in itertools.pairwise(indices)]
    assert max(gaps) - min(gaps) <= 1  # evenly spread, never truncated


@pytest.mark.parametrize(
    ("total", "fps", "expected"), [(30, 30.0, 4), (2, 30.0, 2), (1, 30.0, 1), (31, 2.0, 31)]
)
def test_sample_frame_indices_short_clips(total: int, fps: float, expected: int) -> None:
    assert len(sample_frame_indices(total, fps, CONFIG)) == expected


def test_group_timestamps_worked_example() -> None:
    """Group time = mean of the pair's timestamps, shown with 1 decimal (model.md §9 example 2)."""
    indices = sample_frame_indices(180, 30.0, CONFIG)
    shown = [f"{t:.1f}" for t in group_timestamps(indices, 30.0)]
    assert shown == ["0.3", "1.4", "2.4", "3.5", "4.6", "5.7"]


def test_video_worked_example_token_count() -> None:
    """6 s 448x448 at 2 fps: 12 frames stay 448x448, grid (6, 28, 28), 1,176 video tokens."""
    assert video_smart_resize(12, 448, 448, patch=PATCH, config=CONFIG) == (448, 448)
    assert 6 * (448 // 32) * (448 // 32) == 1176


def test_video_smart_resize_matches_transformers() -> None:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_resize

    uncapped = VideoConfig(cap_pixels_per_frame=False)
    for n, h, w in [(4, 20, 30), (12, 448, 448), (32, 1080, 1920), (32, 2160, 3840), (5, 7, 900)]:
        got = video_smart_resize(n, h, w, patch=PATCH, config=uncapped)
        assert got == hf_resize(
            n, h, w, temporal_factor=2, factor=32, min_pixels=4096, max_pixels=25_165_824
        )


def test_video_webm_without_frame_count(clip_bytes) -> None:
    """Matroska stores no frame count: frames are counted by demuxing, then sampled."""
    data = clip_bytes(3, 8, 64, 64, codec="libvpx-vp9", fmt="webm")
    video = decode(data, "video/webm")
    assert video.total_frames == 24
    assert video.frame_indices[0] == 0 and video.frame_indices[-1] == 23
    assert video.frames.shape == (6, 3, 64, 64)


def test_video_rejects_corrupt_stream() -> None:
    with pytest.raises(UndecodableMedia, match=r"^v could not be decoded as video/mp4"):
        decode(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)


def test_video_rejects_truncated_file(clip_bytes) -> None:
    data = clip_bytes(1, 30, 64, 64)
    with pytest.raises(UndecodableMedia):
        decode(data[: len(data) // 3])


def test_video_rejects_container_mismatching_mime(clip_bytes) -> None:
    with pytest.raises(UndecodableMedia):
        decode(clip_bytes(1, 30, 64, 64), "video/webm")


def test_video_rejects_too_long(clip_bytes) -> None:
    data = clip_bytes(6, 30, 64, 64)
    with pytest.raises(MediaTooLarge, match=r"lasts 6\.0 s; the limit is 5 s"):
        decode(data, limits=MediaLimits(max_video_seconds=5))
    with pytest.raises(MediaTooLarge, match="180 frames or more; the limit is 100 frames"):
        decode(data, limits=MediaLimits(max_video_source_frames=100))


def test_video_rejects_large_frames_before_decoding(clip_bytes) -> None:
    with pytest.raises(MediaTooLarge, match=r"64x64 frames \(4096 pixels\); the limit is 4000"):
        decode(clip_bytes(1, 30, 64, 64), limits=MediaLimits(max_image_pixels=4000))


def test_video_decode_time_is_bounded(clip_bytes) -> None:
    with pytest.raises(MediaTooLarge, match="decode limit"):
        decode(clip_bytes(1, 30, 64, 64), limits=MediaLimits(max_decode_seconds=1e-9))


def test_video_without_pyav_says_what_to_install(monkeypatch, clip_bytes) -> None:
    monkeypatch.setattr(video_module, "av", None)
    with pytest.raises(VideoUnavailable, match=r"install PyAV \(pip install av\)"):
        decode(clip_bytes(1, 30, 64, 64))


def test_video_single_frame_becomes_one_group(clip_bytes) -> None:
    video = decode(clip_bytes(0.1, 10, 64, 64))
    assert video.frame_indices == (0,)
    patches = video_to_patches(video, PATCH)
    assert patches.grid_thw == (1, 4, 4)
    assert group_timestamps(video.frame_indices, video.source_fps) == [0.0]


@pytest.mark.parametrize(("width", "height", "size"), [(64, 64, (64, 64)), (100, 50, (64, 96))])
def test_sampled_frames_match_decoding_every_frame(clip_bytes, width, height, size) -> None:
    """Only sampled frames are converted, by one shared reformatter: the same pixels as converting
    every decoded frame on its own and keeping the sampled ones."""
    import io

    import av
    from sparkinfer.multimodal.image import resize_bicubic

    data = clip_bytes(2, 10, width, height)
    indices = [0, 3, 4, 11, 19]
    got, seen = video_module._decode_frames(data, "video/mp4", indices, size, float("inf"), "v")
    with av.open(io.BytesIO(data), format="mp4") as container:
        every = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    want = torch.stack(
        [
            resize_bicubic(torch.from_numpy(every[i]).permute(2, 0, 1)[None].contiguous(), *size)[0]
            for i in indices
        ]
    )
    assert seen == 20 and got.shape == (5, 3, *size)
    assert torch.equal(got, want)
