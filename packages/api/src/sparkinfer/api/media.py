"""Images and videos of a chat request: `data:` URLs → pixels, expanded prompt, MRoPE positions.

Decoding runs in worker threads, off the event loop. The flow of one request:
1. `load_media`: every `image_url` / `video_url` part, in message order, through
   `sparkinfer.multimodal.process_image` / `process_video` (their count checked first, their
   vision tokens as they add up);
2. the chat template renders one `<|vision_start|><|image_pad|><|vision_end|>` (or video) triple
   per part, and the prompt is tokenized (user text never yields control ids);
3. `expand_media`: each triple becomes the item's full block (`expand_prompt`), and the expanded
   prompt gets its (t, h, w) positions; the engine gets both plus the pixels.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from sparkinfer.api.errors import ContextLengthError, InvalidMedia
from sparkinfer.api.schemas.chat import ChatMessage
from sparkinfer.model.config import ModelConfig
from sparkinfer.model.errors import ConfigError
from sparkinfer.model.mrope import get_rope_positions
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.multimodal import (
    MediaError,
    MediaLimits,
    ProcessedMedia,
    ProcessorConfig,
    VisionTokenIds,
    expand_prompt,
    measure_media,
    pad_runs,
    parse_processor_config,
    process_image,
    process_video,
)
from sparkinfer.scheduler.request import MultimodalInputs

MEDIA_PART_TYPES = ("image_url", "video_url")
PREPROCESSOR_FILE = "preprocessor_config.json"
VIDEO_PREPROCESSOR_FILE = "video_preprocessor_config.json"


@dataclass(frozen=True)
class MediaConfig:
    """What the server needs to take images and videos (None in ServerState: no vision tower).

    use_mrope False: every prompt token, pads included, gets the next sequential position and
    rope_delta is 0, so the model loses the images' 2-D layout (debugging, text-only checkpoints).
    """

    processor: ProcessorConfig
    limits: MediaLimits
    token_ids: VisionTokenIds
    merge_size: int
    use_mrope: bool = True
    max_parts: int = 32  # image and video parts in one request, counted before any decode
    max_tokens: int | None = None  # their vision tokens in all (None: no limit of its own)
    max_request_pixels: int | None = None  # images' header pixels in all, before any decode
    max_request_bytes: int | None = None  # parts' payload bytes in all, before any decode


@dataclass(frozen=True)
class MediaPart:
    """One `image_url` / `video_url` part: where it sits in the request and its URL."""

    field: str  # e.g. messages[1].content[0].image_url
    kind: Literal["image", "video"]
    url: str


def build_media_config(
    model_config: ModelConfig,
    checkpoint_dir: Path | None,
    *,
    limits: MediaLimits,
    video_fps: float,
    video_max_frames: int,
    use_mrope: bool,
    max_parts: int = 32,
    max_tokens: int | None = None,
    max_request_pixels: int | None = None,
    max_request_bytes: int | None = None,
) -> MediaConfig:
    """Processor settings from the checkpoint's preprocessor files (defaults when absent)."""
    vision = model_config.vision
    ids = (
        model_config.image_token_id,
        model_config.video_token_id,
        model_config.vision_start_token_id,
        model_config.vision_end_token_id,
    )
    if vision is None or None in ids:
        raise ConfigError(
            "the checkpoint has a vision tower but config.json lacks vision_config or one of "
            "image_token_id, video_token_id, vision_start_token_id, vision_end_token_id: fix it"
        )
    image_pad, video_pad, start, end = (int(i) for i in ids)  # type: ignore[arg-type]
    processor = parse_processor_config(
        _read_json(checkpoint_dir, PREPROCESSOR_FILE),
        _read_json(checkpoint_dir, VIDEO_PREPROCESSOR_FILE),
        video_fps=video_fps,
        video_max_frames=video_max_frames,
    )
    patch = processor.patch
    geometry = (patch.patch_size, patch.temporal_patch_size, patch.merge_size)
    want = (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size)
    if geometry != want:
        raise ConfigError(
            f"{PREPROCESSOR_FILE} gives patch/temporal/merge sizes {geometry}; vision_config "
            f"has {want}: the processor and the tower must agree"
        )
    return MediaConfig(
        processor=processor,
        limits=limits,
        token_ids=VisionTokenIds(image_pad, video_pad, start, end),
        merge_size=vision.spatial_merge_size,
        use_mrope=use_mrope,
        max_parts=max_parts,
        max_tokens=max_tokens,
        max_request_pixels=max_request_pixels,
        max_request_bytes=max_request_bytes,
    )


def _read_json(folder: Path | None, name: str) -> dict[str, Any] | None:
    path = None if folder is None else folder / name
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}): fix or re-download it") from exc


def media_parts(messages: Sequence[ChatMessage], *, has_vision: bool) -> list[MediaPart]:
    """The request's media parts in message order (InvalidMedia for what cannot be taken)."""
    parts: list[MediaPart] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg.content, list):
            continue
        for j, part in enumerate(msg.content):
            where = f"messages[{i}].content[{j}]"
            if part.type == "input_audio":
                raise InvalidMedia(
                    f"{where} is input_audio: audio input is not supported; send text, "
                    "image_url or video_url parts",
                    param=where,
                )
            if part.type not in MEDIA_PART_TYPES:
                continue
            if not has_vision:
                raise InvalidMedia(
                    f"{where} is {part.type}: this model has no vision tower; send text only",
                    param=where,
                )
            field = f"{where}.{part.type}"
            kind: Literal["image", "video"] = "image" if part.type == "image_url" else "video"
            parts.append(MediaPart(field, kind, _url_of(part.model_extra or {}, part.type, field)))
    return parts


def _url_of(extra: dict[str, Any], key: str, field: str) -> str:
    """`{"image_url": {"url": "data:..."}}` (OpenAI) or `{"image_url": "data:..."}`."""
    value = extra.get(key)
    if isinstance(value, dict):
        value = value.get("url")  # type: ignore[union-attr]
        field += ".url"
    if not isinstance(value, str) or not value:
        raise InvalidMedia(
            f"{field} is missing or not a string: send {{{key!r}: {{'url': 'data:<mime "
            f"type>;base64,<base64 bytes>'}}}}",
            param=field,
        )
    return value


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for the chat template; media parts keep only their type (the template emits one
    placeholder per part; their megabytes of base64 need not go through it)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        message = msg.model_dump(exclude_none=True)
        if isinstance(msg.content, list):
            message["content"] = [
                {"type": part.type} if part.type in MEDIA_PART_TYPES else dumped
                for part, dumped in zip(msg.content, message["content"], strict=True)
            ]
        out.append(message)
    return out


async def load_media(parts: Sequence[MediaPart], config: MediaConfig) -> list[ProcessedMedia]:
    """Decode the parts one after another in a worker thread; the first bad part is the error.

    The count is checked before any decode, and the vision tokens as they add up, so a request
    of many parts is refused before its pixels take the memory of all of them.
    """
    if len(parts) > config.max_parts:
        raise InvalidMedia(
            f"the request has {len(parts)} image and video parts; at most {config.max_parts} "
            "are taken (max_media_parts): send fewer",
            param=parts[config.max_parts].field,
        )
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, check_media_budget, parts, config)
    out: list[ProcessedMedia] = []
    num_tokens = 0
    for part in parts:
        process = process_image if part.kind == "image" else process_video
        call = functools.partial(
            process, part.url, field=part.field, config=config.processor, limits=config.limits
        )
        try:
            item = await loop.run_in_executor(None, call)
        except MediaError as exc:
            raise InvalidMedia(str(exc), param=part.field) from None
        t, h, w = item.grid_thw
        num_tokens += t * h * w // item.merge_size**2
        if config.max_tokens is not None and num_tokens > config.max_tokens:
            raise ContextLengthError(
                f"the images and videos up to {part.field} take {num_tokens} tokens; at most "
                f"{config.max_tokens} are taken (max_media_tokens, or max_model_len): send "
                "fewer or smaller ones",
                param=part.field,
            )
        out.append(item)
    return out


def check_media_budget(parts: Sequence[MediaPart], config: MediaConfig) -> None:
    """The request's payload bytes and image pixels in all, read from the data URLs and the
    images' headers before anything is decoded (blocking: run it in a worker thread)."""
    num_bytes = num_pixels = 0
    for part in parts:
        try:
            size = measure_media(part.url, part.kind, field=part.field, limits=config.limits)
        except MediaError as exc:
            raise InvalidMedia(str(exc), param=part.field) from None
        num_bytes += size.num_bytes
        num_pixels += size.num_pixels
        if config.max_request_bytes is not None and num_bytes > config.max_request_bytes:
            raise InvalidMedia(
                f"the images and videos up to {part.field} hold {num_bytes} bytes; at most "
                f"{config.max_request_bytes} are taken in one request (media_max_request_bytes):"
                " send fewer or smaller ones",
                param=part.field,
            )
        if config.max_request_pixels is not None and num_pixels > config.max_request_pixels:
            raise InvalidMedia(
                f"the images up to {part.field} hold {num_pixels} pixels; at most "
                f"{config.max_request_pixels} are decoded in one request "
                "(media_max_request_pixels): send fewer or smaller images",
                param=part.field,
            )


def expand_media(
    prompt_ids: list[int],
    media: Sequence[ProcessedMedia],
    config: MediaConfig,
    tokenizer: Tokenizer,
) -> tuple[list[int], MultimodalInputs | None]:
    """Expand the template's placeholders and build the engine's inputs (None: no media)."""
    if not media:
        return prompt_ids, None
    try:
        ids = expand_prompt(
            prompt_ids, media, token_ids=config.token_ids, encode_text=tokenizer.encode
        )
        runs = pad_runs(ids, media, token_ids=config.token_ids)
    except MediaError as exc:
        raise InvalidMedia(str(exc), param="messages") from None
    grids = [m.grid_thw for m in media]
    positions, rope_delta = None, 0
    if config.use_mrope:
        positions, rope_delta = get_rope_positions(
            ids,
            [m.grid_thw for m in media if m.kind == "image"],
            [m.grid_thw for m in media if m.kind == "video"],
            image_token_id=config.token_ids.image_pad,
            video_token_id=config.token_ids.video_pad,
            spatial_merge_size=config.merge_size,
        )
    pieces = [m.pixel_values for m in media]
    mm = MultimodalInputs(
        pixel_values=pieces[0] if len(pieces) == 1 else torch.cat(pieces),  # no copy of one
        grid_thw=tuple(grids),
        kinds=tuple(m.kind for m in media),
        positions=positions,
        rope_delta=rope_delta,
        content_hashes=tuple(m.content_hash for m in media),
        pad_runs=runs,
    )
    return ids, mm
