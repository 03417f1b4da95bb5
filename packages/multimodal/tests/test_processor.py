"""Media parts -> pixel tensors, grids, placeholder counts and the expanded prompt (model.md §9)."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from sparkinfer.multimodal.data_url import MediaLimits
from sparkinfer.multimodal.errors import (
    MediaTooLarge,
    PlaceholderMismatch,
    UndecodableMedia,
    UnsupportedMediaSource,
    UnsupportedMediaType,
)
from sparkinfer.multimodal.image import ImageConfig
from sparkinfer.multimodal.processor import (
    ProcessedMedia,
    ProcessorConfig,
    VisionTokenIds,
    content_hash,
    expand_prompt,
    pad_runs,
    parse_processor_config,
    placeholder_ids,
    process_image,
    process_video,
)

IDS = VisionTokenIds()
START, END, IMG, VID = IDS.vision_start, IDS.vision_end, IDS.image_pad, IDS.video_pad
CONFIG = ProcessorConfig()
LIMITS = MediaLimits()
SPECIAL = {
    START: "<|vision_start|>",
    END: "<|vision_end|>",
    IMG: "<|image_pad|>",
    VID: "<|video_pad|>",
}


def char_encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character."""
    return [1000 + ord(c) for c in text]


def six_token_encode(text: str) -> list[int]:
    """A stand-in with the Qwen tokenizer's count for `<X.X seconds>`: 6 tokens (model.md §9)."""
    return [7] * 6


def to_text(ids: list[int]) -> str:
    return "".join(SPECIAL.get(i, chr(i - 1000)) for i in ids)


def image_media(h: int, w: int) -> ProcessedMedia:
    return ProcessedMedia("image", torch.zeros(h * w, 1536), (1, h, w), f"img{h}x{w}")


def video_media(t: int, h: int, w: int, stamps: tuple[float, ...]) -> ProcessedMedia:
    return ProcessedMedia(
        "video", torch.zeros(t * h * w, 1536), (t, h, w), f"vid{t}x{h}x{w}", timestamps=stamps
    )


def test_process_image_from_data_url(image_bytes, data_url) -> None:
    media = process_image(
        data_url("image/png", image_bytes(448, 448)), field="f", config=CONFIG, limits=LIMITS
    )
    assert media.kind == "image" and media.grid_thw == (1, 28, 28)
    assert media.pixel_values.shape == (784, 1536) and media.pixel_values.dtype == torch.float32
    assert media.num_patches == 784 and media.num_tokens == 196
    again = process_image(
        data_url("image/png", image_bytes(448, 448)), field="f", config=CONFIG, limits=LIMITS
    )
    assert media.content_hash == again.content_hash
    assert media.content_hash != hashlib.sha256(image_bytes(448, 448)).hexdigest()  # + settings
    prompt = expand_prompt([1, START, IMG, END, 2], [media], token_ids=IDS, encode_text=char_encode)
    assert prompt == [1, START, *[IMG] * 196, END, 2]  # 198-token block (model.md §9, example 1)


def test_process_video_worked_example(clip_bytes, data_url) -> None:
    """6 s 448x448 at 30 fps: grid (6, 28, 28), 1,176 pads, 1,224 prompt tokens (model.md §9)."""
    data = clip_bytes(6, 30, 448, 448, noise=False)
    media = process_video(data_url("video/mp4", data), field="f", config=CONFIG, limits=LIMITS)
    assert media.kind == "video" and media.grid_thw == (6, 28, 28)
    assert media.num_patches == 4704 and media.num_tokens == 1176
    assert [f"{t:.1f}" for t in media.timestamps] == ["0.3", "1.4", "2.4", "3.5", "4.6", "5.7"]
    block = placeholder_ids(media, token_ids=IDS, encode_text=six_token_encode)
    assert len(block) == 1224
    assert block.count(START) == block.count(END) == 6 and block.count(VID) == 1176


def test_expand_prompt_video_matches_reference_replacement() -> None:
    """Our triple replacement equals the reference's per-group text for the pad token alone."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    indices, fps = [0, 16, 33, 49, 65, 81], 30.0
    reference = SimpleNamespace(
        video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
        _calculate_timestamps=partial(Qwen3VLProcessor._calculate_timestamps, None),
        vision_start_token=SPECIAL[START],
        vision_end_token=SPECIAL[END],
        video_token=SPECIAL[VID],
    )
    inputs = {
        "video_grid_thw": torch.tensor([[3, 4, 6]]),
        "video_metadata": [SimpleNamespace(fps=fps, frames_indices=indices)],
    }
    want = Qwen3VLProcessor.replace_video_token(reference, inputs, 0)
    stamps = tuple((indices[i] + indices[i + 1]) / 2 / fps for i in range(0, 6, 2))
    media = video_media(3, 4, 6, stamps)
    got = expand_prompt([5, START, VID, END, 6], [media], token_ids=IDS, encode_text=char_encode)
    assert got[0] == 5 and got[-1] == 6
    assert to_text(got[1:-1]) == want  # no outer vision_start / vision_end around the groups
    assert want.startswith("<0.3 seconds><|vision_start|>")


def test_expand_prompt_mixed_media_in_order() -> None:
    media = [image_media(4, 4), video_media(1, 2, 2, (0.5,)), image_media(2, 4)]
    prompt = [9, START, IMG, END, START, VID, END, 8, START, IMG, END]
    got = expand_prompt(prompt, media, token_ids=IDS, encode_text=char_encode)
    stamp = char_encode("<0.5 seconds>")
    assert got == [
        9,
        *[START, *[IMG] * 4, END],
        *[*stamp, START, VID, END],
        8,
        *[START, *[IMG] * 2, END],
    ]


@pytest.mark.parametrize(
    ("prompt", "media", "match"),
    [
        ([START, IMG, END, START, IMG, END], [image_media(2, 2)], "more image placeholders"),
        ([START, IMG, END], [image_media(2, 2), image_media(2, 2)], "only 1 placeholders"),
        ([1, 2], [image_media(2, 2)], "only 0 placeholders"),
        ([START, VID, END], [image_media(2, 2)], "expects a video, but media part 0 is an image"),
        ([1, IMG, 2], [], "outside a vision_start/vision_end placeholder"),
        ([START, IMG, IMG, END], [image_media(2, 2)], "index 1 outside"),
    ],
)
def test_expand_prompt_rejects_mismatched_placeholders(prompt, media, match) -> None:
    with pytest.raises(PlaceholderMismatch, match=match):
        expand_prompt(prompt, media, token_ids=IDS, encode_text=char_encode)


def test_processing_runs_in_worker_threads(image_bytes, data_url) -> None:
    urls = [data_url("image/png", image_bytes(64 + 32 * i, 80, seed=i)) for i in range(4)]
    run = partial(process_image, field="f", config=CONFIG, limits=LIMITS)
    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(run, urls))
    for url, media in zip(urls, threaded, strict=True):
        assert torch.equal(media.pixel_values, run(url).pixel_values)


def test_process_refuses_bad_media(image_bytes, clip_bytes, data_url) -> None:
    png, mp4 = image_bytes(64, 64), clip_bytes(1, 30, 64, 64)
    image = partial(process_image, field="messages[0].content[0].image_url", config=CONFIG)
    video = partial(process_video, field="messages[0].content[0].video_url", config=CONFIG)
    with pytest.raises(UnsupportedMediaSource, match=r"^messages\[0\]\.content\[0\]\.image_url"):
        image("https://example.com/a.png", limits=LIMITS)
    with pytest.raises(UnsupportedMediaType):
        image(data_url("video/mp4", mp4), limits=LIMITS)
    with pytest.raises(UnsupportedMediaType):
        video(data_url("image/png", png), limits=LIMITS)
    with pytest.raises(UndecodableMedia):
        image(data_url("image/png", b"not a png at all"), limits=LIMITS)
    with pytest.raises(UndecodableMedia):
        video(data_url("video/mp4", b"not an mp4 at all"), limits=LIMITS)
    with pytest.raises(MediaTooLarge):
        image(data_url("image/png", png), limits=MediaLimits(max_bytes=len(png) - 1))
    with pytest.raises(MediaTooLarge):
        video(data_url("video/mp4", mp4), limits=MediaLimits(max_video_seconds=0.5))


def test_parse_processor_config_from_checkpoint_files() -> None:
    """model.md §1 preprocessor configs (image, video); fps and frame budget are policy."""
    pre = {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 3,
        "rescale_factor": 0.00392156862745098,
    }
    vid = {"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "temporal_patch_size": 2}
    config = parse_processor_config(pre, vid, video_max_frames=16)
    assert config.image.min_pixels == 65536 and config.image.max_pixels == 16777216
    assert config.video.min_pixels == 4096 and config.video.max_pixels == 25165824
    assert config.video.max_frames == 16 and config.video.fps == 2.0
    assert config.patch.patch_dim == 1536 and config.patch.factor == 32
    assert parse_processor_config(None) == ProcessorConfig()


def test_content_hash_changes_with_the_settings_that_shape_the_pixels() -> None:
    bounds = (CONFIG.patch, CONFIG.image)
    smaller = (CONFIG.patch, ImageConfig(max_pixels=CONFIG.image.max_pixels // 2))
    assert content_hash("image", b"x", bounds) == content_hash("image", b"x", bounds)
    assert content_hash("image", b"x", bounds) != content_hash("image", b"x", smaller)
    assert content_hash("image", b"x", bounds) != content_hash("video", b"x", bounds)
    assert content_hash("image", b"x", bounds) != content_hash("image", b"y", bounds)


def test_pad_runs_of_an_expanded_prompt() -> None:
    media = [image_media(4, 4), video_media(2, 4, 4, (0.0, 1.0)), image_media(2, 4)]
    prompt = [1, START, IMG, END, START, VID, END, 2, START, IMG, END]
    ids = expand_prompt(prompt, media, token_ids=IDS, encode_text=six_token_encode)
    runs = pad_runs(ids, media, token_ids=IDS)
    assert [(idx, end - start) for start, end, idx in runs] == [(0, 4), (1, 4), (1, 4), (2, 2)]
    assert all(set(ids[start:end]) <= {IMG, VID} for start, end, _ in runs)
    assert sum(end - start for start, end, _ in runs) == sum(i in (IMG, VID) for i in ids)
    with pytest.raises(PlaceholderMismatch, match="pad runs"):
        pad_runs(ids, [*media, image_media(2, 2)], token_ids=IDS)
    with pytest.raises(PlaceholderMismatch, match="no media part"):
        pad_runs(ids, [image_media(2, 2), *media[1:]], token_ids=IDS)


def test_measure_media_reads_bytes_and_header_pixels_without_decoding() -> None:
    import base64
    import io

    from PIL import Image
    from sparkinfer.multimodal.errors import MediaError
    from sparkinfer.multimodal.processor import MediaSize, measure_media

    buf = io.BytesIO()
    Image.new("RGB", (300, 200)).save(buf, format="PNG")
    data = buf.getvalue()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    size = measure_media(url, "image", field="f", limits=MediaLimits())
    assert size == MediaSize(num_bytes=len(data), num_pixels=60_000)
    truncated = "data:image/png;base64," + base64.b64encode(data[:10]).decode()
    with pytest.raises(MediaError, match="f "):
        measure_media(truncated, "image", field="f", limits=MediaLimits())
