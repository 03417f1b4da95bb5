"""Media in a request → pixel tensors, grids and the expanded prompt (docs/model.md §9).

Everything here is a pure function of its arguments and safe to call from worker threads, so the
api runs it off the event loop. The api's flow for one request:

1. `process_image(url, ...)` / `process_video(url, ...)` for each media part, in message order;
2. render the chat template (it emits `<|vision_start|><|image_pad|><|vision_end|>` or the
   `<|video_pad|>` triple per part) and tokenize it;
3. `expand_prompt(prompt_ids, media, ...)` replaces each triple with the media's full block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from sparkinfer.multimodal.data_url import MediaLimits, parse_data_url
from sparkinfer.multimodal.errors import PlaceholderMismatch
from sparkinfer.multimodal.image import (
    IMAGE_MIME_TYPES,
    ImageConfig,
    PatchConfig,
    decode_image,
    image_size,
    image_to_patches,
)
from sparkinfer.multimodal.video import (
    VIDEO_MIME_TYPES,
    VideoConfig,
    decode_video,
    group_timestamps,
    video_to_patches,
)
from sparkinfer.multimodal.video_sampling import VideoSampling

_ARTICLE = {"image": "an image", "video": "a video"}
# sha256 releases the GIL on large inputs: the content hash runs here while the caller's thread
# decodes and patchifies the same bytes
_HASHER = ThreadPoolExecutor(max_workers=4, thread_name_prefix="media-hash")


@dataclass(frozen=True)
class VisionTokenIds:
    """Token ids of the vision placeholders (config.json top level, docs/model.md §1, §12)."""

    image_pad: int = 248056
    video_pad: int = 248057
    vision_start: int = 248053
    vision_end: int = 248054


@dataclass(frozen=True)
class ProcessorConfig:
    """Everything preprocessing needs: patch geometry, image bounds, video sampling."""

    patch: PatchConfig = field(default_factory=PatchConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    video: VideoConfig = field(default_factory=VideoConfig)


@dataclass(frozen=True)
class ProcessedMedia:
    """One image or video, ready for the vision tower and the prompt.

    pixel_values: [t * h * w, 1536] float32 patch vectors (merge-block order)
    grid_thw:     (t, h, w) in patches; an image has t = 1
    content_hash: sha256 hex of the media bytes and the processor settings that shape the pixels
                  (`content_hash`): pad tokens look alike for every image, so the tower-output
                  cache and the prefix cache key media by this
    timestamps:   video only: seconds shown before each of the t temporal groups
    """

    kind: Literal["image", "video"]
    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    content_hash: str
    merge_size: int = 2
    timestamps: tuple[float, ...] = ()

    @property
    def num_patches(self) -> int:
        """Rows the vision tower sees (4x the tokens)."""
        t, h, w = self.grid_thw
        return t * h * w

    @property
    def tokens_per_group(self) -> int:
        """Pad tokens per temporal group: (h / 2) * (w / 2)."""
        _, h, w = self.grid_thw
        return (h // self.merge_size) * (w // self.merge_size)

    @property
    def num_tokens(self) -> int:
        """Pad tokens in the prompt (the vision tower's output rows)."""
        return self.grid_thw[0] * self.tokens_per_group


def parse_processor_config(
    preprocessor: Mapping[str, Any] | None,
    video_preprocessor: Mapping[str, Any] | None = None,
    *,
    video_fps: float = VideoSampling.fps,
    video_max_frames: int = VideoSampling.max_frames,
) -> ProcessorConfig:
    """Build a ProcessorConfig from preprocessor_config.json / video_preprocessor_config.json.

    Patch geometry, normalisation and pixel bounds come from the files (missing files or keys keep
    the Qwen3.5 defaults); the frame rate and frame budget are server policy and come from the
    arguments.
    """
    pre = dict(preprocessor or {})
    vid = dict(video_preprocessor or {})
    size, vsize = pre.get("size") or {}, vid.get("size") or {}
    patch = PatchConfig(
        patch_size=int(pre.get("patch_size", 16)),
        temporal_patch_size=int(pre.get("temporal_patch_size", 2)),
        merge_size=int(pre.get("merge_size", 2)),
        image_mean=tuple(float(x) for x in pre.get("image_mean", (0.5, 0.5, 0.5))),  # type: ignore[arg-type]
        image_std=tuple(float(x) for x in pre.get("image_std", (0.5, 0.5, 0.5))),  # type: ignore[arg-type]
        rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
    )
    image = ImageConfig(
        min_pixels=int(size.get("shortest_edge", pre.get("min_pixels", 65_536))),
        max_pixels=int(size.get("longest_edge", pre.get("max_pixels", 16_777_216))),
    )
    video = VideoConfig(
        fps=video_fps,
        min_frames=min(int(vid.get("min_frames", 4)), video_max_frames),
        max_frames=video_max_frames,
        min_pixels=int(vsize.get("shortest_edge", 4_096)),
        max_pixels=int(vsize.get("longest_edge", 25_165_824)),
    )
    return ProcessorConfig(patch=patch, image=image, video=video)


def content_hash(kind: str, data: bytes, settings: tuple[object, ...]) -> str:
    """sha256 hex of what decides the tower's input: the kind, the processor settings (their
    frozen dataclass reprs) and the media bytes. The same bytes under other settings (patch
    geometry, pixel bounds, frame rate) give other pixels, so another hash."""
    digest = hashlib.sha256(kind.encode())
    for setting in settings:
        digest.update(repr(setting).encode())
    digest.update(data)
    return digest.hexdigest()


def _hash_in_background(kind: str, data: bytes, settings: tuple[object, ...]) -> Future[str]:
    """`content_hash` on a worker thread: an unused result (a refused medium) is simply dropped."""
    return _HASHER.submit(content_hash, kind, data, settings)


@dataclass(frozen=True)
class MediaSize:
    """What one media part costs before it is decoded: its payload and, for an image, its
    pixels (from the header)."""

    num_bytes: int
    num_pixels: int


def measure_media(
    url: str, kind: Literal["image", "video"], *, field: str, limits: MediaLimits
) -> MediaSize:
    """A part's payload bytes and (images) header pixels; MediaError for anything unusable."""
    types = IMAGE_MIME_TYPES if kind == "image" else VIDEO_MIME_TYPES
    parsed = parse_data_url(url, field=field, allowed_types=types, limits=limits)
    if kind == "video":
        return MediaSize(len(parsed.data), 0)
    width, height = image_size(parsed.data, field=field)
    return MediaSize(len(parsed.data), width * height)


def process_image(
    url: str, *, field: str, config: ProcessorConfig, limits: MediaLimits
) -> ProcessedMedia:
    """Decode an image `data:` URL into patches. Raises MediaError for anything unusable."""
    parsed = parse_data_url(url, field=field, allowed_types=IMAGE_MIME_TYPES, limits=limits)
    digest = _hash_in_background("image", parsed.data, (config.patch, config.image))
    image = decode_image(parsed.data, field=field, limits=limits)
    patches = image_to_patches(image, patch=config.patch, config=config.image, field=field)
    return ProcessedMedia(
        kind="image",
        pixel_values=patches.pixel_values,
        grid_thw=patches.grid_thw,
        content_hash=digest.result(),
        merge_size=config.patch.merge_size,
    )


def process_video(
    url: str, *, field: str, config: ProcessorConfig, limits: MediaLimits
) -> ProcessedMedia:
    """Decode a video `data:` URL, sample its frames and patchify them. Raises MediaError."""
    parsed = parse_data_url(url, field=field, allowed_types=VIDEO_MIME_TYPES, limits=limits)
    digest = _hash_in_background("video", parsed.data, (config.patch, config.video))
    video = decode_video(
        parsed.data,
        parsed.mime_type,
        field=field,
        patch=config.patch,
        config=config.video,
        limits=limits,
    )
    patches = video_to_patches(video, config.patch)
    stamps = group_timestamps(
        video.frame_indices, video.source_fps, config.patch.temporal_patch_size
    )
    return ProcessedMedia(
        kind="video",
        pixel_values=patches.pixel_values,
        grid_thw=patches.grid_thw,
        content_hash=digest.result(),
        merge_size=config.patch.merge_size,
        timestamps=tuple(stamps),
    )


def timestamp_text(seconds: float) -> str:
    """The text before each video group, e.g. `<0.3 seconds>`."""
    return f"<{seconds:.1f} seconds>"


def placeholder_ids(
    media: ProcessedMedia, *, token_ids: VisionTokenIds, encode_text: Callable[[str], list[int]]
) -> list[int]:
    """The prompt block of one media item.

    image: vision_start + N x image_pad + vision_end.
    video: per temporal group, `<t seconds>` text + vision_start + pads + vision_end.
    """
    if media.kind == "image":
        return [
            token_ids.vision_start,
            *[token_ids.image_pad] * media.num_tokens,
            token_ids.vision_end,
        ]
    group = [
        token_ids.vision_start,
        *[token_ids.video_pad] * media.tokens_per_group,
        token_ids.vision_end,
    ]
    out: list[int] = []
    for seconds in media.timestamps:
        out += encode_text(timestamp_text(seconds))
        out += group
    return out


def expand_prompt(
    prompt_ids: Sequence[int],
    media: Sequence[ProcessedMedia],
    *,
    token_ids: VisionTokenIds,
    encode_text: Callable[[str], list[int]],
) -> list[int]:
    """Replace each template triple `vision_start, image_pad|video_pad, vision_end` with its block.

    The whole triple is replaced (model.md §9 placement rule), so a video has no outer vision_start
    or vision_end. Media are matched to triples in order; any mismatch in count or kind, or a pad
    token outside a triple, raises PlaceholderMismatch.
    """
    pads = {token_ids.image_pad: "image", token_ids.video_pad: "video"}
    out: list[int] = []
    items = iter(enumerate(media))
    i, n = 0, len(prompt_ids)
    while i < n:
        tok = prompt_ids[i]
        is_triple = (
            tok == token_ids.vision_start
            and i + 2 < n
            and prompt_ids[i + 1] in pads
            and prompt_ids[i + 2] == token_ids.vision_end
        )
        if is_triple:
            kind = pads[prompt_ids[i + 1]]
            idx, item = next(items, (len(media), None))
            if item is None:
                raise PlaceholderMismatch(
                    f"the prompt has more {kind} placeholders than the {len(media)} media parts "
                    f"sent: send one media part per placeholder"
                )
            if item.kind != kind:
                raise PlaceholderMismatch(
                    f"placeholder {idx} of the prompt expects {_ARTICLE[kind]}, but media part "
                    f"{idx} is {_ARTICLE[item.kind]}: keep media parts in message order"
                )
            out += placeholder_ids(item, token_ids=token_ids, encode_text=encode_text)
            i += 3
            continue
        if tok in pads:
            raise PlaceholderMismatch(
                f"the prompt has a {pads[tok]} pad token (id {tok}) at index {i} outside a "
                f"vision_start/vision_end placeholder: media go in image_url/video_url parts"
            )
        out.append(tok)
        i += 1
    used = next(items, None)
    if used is not None:
        raise PlaceholderMismatch(
            f"{len(media)} media parts were sent but the prompt has only {used[0]} placeholders: "
            f"the chat template must emit one placeholder per media part"
        )
    return out


def pad_runs(
    expanded_ids: Sequence[int], media: Sequence[ProcessedMedia], *, token_ids: VisionTokenIds
) -> tuple[tuple[int, int, int], ...]:
    """(start, end, item index) of each run of pad tokens in an `expand_prompt` result: an image
    is one run, a video one per temporal group. Raises PlaceholderMismatch when the runs do not
    match the media (a prompt not built by `expand_prompt` with these media)."""
    pads = (token_ids.image_pad, token_ids.video_pad)
    owners = [(i, m.tokens_per_group) for i, m in enumerate(media) for _ in range(m.grid_thw[0])]
    runs: list[tuple[int, int, int]] = []
    i, n = 0, len(expanded_ids)
    while i < n:
        if expanded_ids[i] not in pads:
            i += 1
            continue
        start = i
        while i < n and expanded_ids[i] == expanded_ids[start]:
            i += 1
        if len(runs) >= len(owners) or owners[len(runs)][1] != i - start:
            raise PlaceholderMismatch(
                f"the pad run at index {start} has {i - start} tokens, which no media part "
                "fills there: expand the prompt with expand_prompt and the same media"
            )
        runs.append((start, i, owners[len(runs)][0]))
    if len(runs) != len(owners):
        raise PlaceholderMismatch(
            f"the prompt has {len(runs)} pad runs; its media fill {len(owners)}: expand the "
            "prompt with expand_prompt and the same media"
        )
    return tuple(runs)
