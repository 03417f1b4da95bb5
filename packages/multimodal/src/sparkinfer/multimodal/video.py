"""Video: decode with PyAV (its wheel bundles FFmpeg), sample frames over the whole clip, patchify.

Sampling follows the checkpoint's `Qwen3VLVideoProcessor`: n = clamp(floor(frames / fps * 2),
min_frames, min(max_frames, frames)) frames at round(linspace(0, frames - 1, n)), so a long clip is
sampled more sparsely, never cut short: the first and the last frame are always kept. Each pair of
frames is one temporal group, labelled in the prompt by the mean of its two timestamps.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from sparkinfer.multimodal.data_url import MediaLimits
from sparkinfer.multimodal.errors import (
    MediaError,
    MediaTooLarge,
    UndecodableMedia,
    VideoUnavailable,
)
from sparkinfer.multimodal.image import PatchConfig, Patches, patchify, resize_bicubic

try:
    import av
    import av.error
    import av.video.reformatter
except ImportError:  # video requests then get VideoUnavailable; images keep working
    av = None

# MIME type -> FFmpeg demuxer; forcing the demuxer keeps FFmpeg from probing playlist or concat
# formats that open further URLs or files
VIDEO_MIME_TYPES = {
    "video/mp4": "mp4",
    "video/quicktime": "mov",
    "video/webm": "webm",
    "video/x-matroska": "matroska",
    "video/x-msvideo": "avi",
}


@dataclass(frozen=True)
class VideoConfig:
    """Frame sampling and per-video resize bounds (docs/model.md §1 video_preprocessor_config, §9).

    max_frames is the sampling budget: longer clips are sampled more sparsely. With
    cap_pixels_per_frame, each frame is held to max_tokens_per_frame merged tokens and an even
    share of max_pixels, as the reference qwen-vl-utils pipeline does.
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 32
    min_pixels: int = 4_096
    max_pixels: int = 25_165_824
    cap_pixels_per_frame: bool = True
    max_tokens_per_frame: int = 768

    def __post_init__(self) -> None:
        if not self.fps > 0:
            raise ValueError(f"VideoConfig.fps is {self.fps}; it must be > 0")
        if not 1 <= self.min_frames <= self.max_frames:
            raise ValueError(
                f"VideoConfig min_frames {self.min_frames} / max_frames {self.max_frames}: need "
                f"1 <= min_frames <= max_frames"
            )
        if not 0 < self.min_pixels <= self.max_pixels or self.max_tokens_per_frame < 1:
            raise ValueError(
                f"VideoConfig min_pixels {self.min_pixels} / max_pixels {self.max_pixels} / "
                f"max_tokens_per_frame {self.max_tokens_per_frame}: need 0 < min <= max and "
                f"tokens >= 1"
            )


@dataclass(frozen=True)
class DecodedVideo:
    """Sampled frames, already resized to the patch grid.

    frames:        uint8 [n, 3, H', W'] (H', W' multiples of 32)
    frame_indices: index in the source stream of each sampled frame
    source_fps:    the stream's average frame rate
    total_frames:  frames in the source stream
    """

    frames: torch.Tensor
    frame_indices: tuple[int, ...]
    source_fps: float
    total_frames: int

    @property
    def timestamps(self) -> tuple[float, ...]:
        """Seconds of each sampled frame: index / fps."""
        return tuple(i / self.source_fps for i in self.frame_indices)


def sample_frame_indices(total_frames: int, source_fps: float, config: VideoConfig) -> list[int]:
    """Indices of the frames to keep, spread evenly from the first to the last frame."""
    num = int(total_frames / source_fps * config.fps)
    num = min(max(num, config.min_frames), config.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, num).round().astype(int).tolist()


def group_timestamps(
    frame_indices: list[int] | tuple[int, ...], source_fps: float, temporal_patch_size: int = 2
) -> list[float]:
    """Seconds shown for each temporal group: mean of its first and last frame's timestamps."""
    idx = list(frame_indices)
    idx += [idx[-1]] * (-len(idx) % temporal_patch_size)
    ts = [i / source_fps for i in idx]
    step = temporal_patch_size
    return [(ts[i] + ts[i + step - 1]) / 2 for i in range(0, len(ts), step)]


def video_smart_resize(
    num_frames: int, height: int, width: int, *, patch: PatchConfig, config: VideoConfig
) -> tuple[int, int]:
    """Per-frame target (height, width): multiples of 32, whole-clip pixels within bounds."""
    factor, tf = patch.factor, patch.temporal_patch_size
    num_frames = max(num_frames, tf)
    max_pixels = config.max_pixels
    if config.cap_pixels_per_frame:
        per_frame = min(config.max_tokens_per_frame * factor * factor, max_pixels // num_frames)
        max_pixels = max(per_frame, int(config.min_pixels * 1.05)) * num_frames
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise MediaError(f"video frames are {width}x{height}, an aspect ratio above 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / tf) * tf
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < config.min_pixels:
        beta = math.sqrt(config.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def decode_video(
    data: bytes,
    mime_type: str,
    *,
    field: str,
    patch: PatchConfig,
    config: VideoConfig,
    limits: MediaLimits,
) -> DecodedVideo:
    """Decode the sampled frames of the first video stream, resizing each as it is decoded.

    Refuses (MediaError) missing PyAV, unknown containers, corrupt streams, and clips over the
    duration, frame, pixel or decode-time limits. If the stream holds fewer frames than its header
    declares, sampling is redone over the frames it really holds.
    """
    if av is None:
        raise VideoUnavailable(
            f"{field} is a video, but this server cannot decode video: install PyAV "
            f"(pip install av) on the server, or send images instead"
        )
    if mime_type not in VIDEO_MIME_TYPES:
        raise MediaError(f"{field} has MIME type {mime_type!r}, not a video type")
    deadline = time.monotonic() + limits.max_decode_seconds
    try:
        total, fps, height, width = _probe(data, mime_type, field=field, limits=limits)
        indices = sample_frame_indices(total, fps, config)
        size = video_smart_resize(len(indices), height, width, patch=patch, config=config)
        frames, num_decoded = _decode_frames(data, mime_type, indices, size, deadline, field)
        if num_decoded < total and len(frames) < len(indices):
            if num_decoded == 0:
                raise UndecodableMedia(f"{field} holds no decodable video frame")
            total = num_decoded
            indices = sample_frame_indices(total, fps, config)
            size = video_smart_resize(len(indices), height, width, patch=patch, config=config)
            frames, _ = _decode_frames(data, mime_type, indices, size, deadline, field)
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, EOFError, MemoryError) as exc:
        raise UndecodableMedia(
            f"{field} could not be decoded as {mime_type} ({type(exc).__name__}: the file is "
            f"corrupt, truncated or uses an unsupported codec): send an intact H.264/VP9 video"
        ) from None
    if len(frames) < len(indices):
        raise UndecodableMedia(f"{field} ended before its sampled frames could be decoded")
    return DecodedVideo(
        frames=frames,
        frame_indices=tuple(indices),
        source_fps=fps,
        total_frames=total,
    )


def _open(data: bytes, mime_type: str):  # -> av.container.InputContainer
    assert av is not None, "decode_video refuses video without PyAV"
    return av.open(io.BytesIO(data), mode="r", format=VIDEO_MIME_TYPES[mime_type])


def _probe(
    data: bytes, mime_type: str, *, field: str, limits: MediaLimits
) -> tuple[int, float, int, int]:
    """(total frames, fps, height, width) of the first video stream, checked against limits."""
    with _open(data, mime_type) as container:
        if not container.streams.video:
            raise UndecodableMedia(f"{field} holds no video stream")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        if not rate or rate <= 0:
            raise UndecodableMedia(f"{field} has no frame rate: re-encode it with a fixed rate")
        fps = float(rate)
        height, width = stream.codec_context.height, stream.codec_context.width
        if height * width > limits.max_image_pixels:
            raise MediaTooLarge(
                f"{field} has {width}x{height} frames ({width * height} pixels); the limit is "
                f"{limits.max_image_pixels} pixels: downscale the video"
            )
        if min(height, width) < 1:
            raise UndecodableMedia(f"{field} declares {width}x{height} frames")
        most = limits.max_video_source_frames
        total = stream.frames or _count_packets(container, stream, most + 1)
    _check_length(total, fps, field=field, limits=limits)
    return total, fps, height, width


def _count_packets(container, stream, stop: int) -> int:
    """Frames in a stream whose header does not say: its packets, demuxed without decoding."""
    count = 0
    for packet in container.demux(stream):
        if packet.size:
            count += 1
            if count >= stop:
                break
    return count


def _check_length(total: int, fps: float, *, field: str, limits: MediaLimits) -> None:
    if total < 1:
        raise UndecodableMedia(f"{field} holds no video frame")
    most = limits.max_video_source_frames
    if total > most:
        raise MediaTooLarge(
            f"{field} has {total} frames or more; the limit is {most} frames: "
            f"send a shorter clip or a lower frame rate"
        )
    if total / fps > limits.max_video_seconds:
        raise MediaTooLarge(
            f"{field} lasts {total / fps:.1f} s; the limit is {limits.max_video_seconds:g} s: "
            f"send a shorter clip"
        )


def _decode_frames(
    data: bytes,
    mime_type: str,
    indices: list[int],
    size: tuple[int, int],
    deadline: float,
    field: str,
) -> tuple[torch.Tensor, int]:
    """Decode up to the last wanted frame: (resized uint8 [n, 3, H', W'] frames, frames seen).

    Every frame is decoded (each depends on those before it), but only the wanted ones are
    converted to RGB, all by one reformatter (a frame's own `to_ndarray` builds a new swscale
    context, with its threads, per frame: most of the conversion's cost), and each is written
    straight into its slot of the returned tensor.
    """
    assert av is not None, "decode_video checks that PyAV is installed first"
    wanted = set(indices)
    frames = torch.empty((len(indices), 3, *size), dtype=torch.uint8)
    num_kept = 0
    num_decoded = 0
    reformatter = av.video.reformatter.VideoReformatter()
    with _open(data, mime_type) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # FFmpeg's frame and slice threads: the same frames, sooner
        height, width = stream.codec_context.height, stream.codec_context.width
        for frame in container.decode(stream):
            if time.monotonic() > deadline:
                raise MediaTooLarge(
                    f"{field} took longer than the server's decode limit: send a shorter or "
                    f"smaller clip"
                )
            if num_decoded in wanted:
                # frames whose size changes mid-stream are scaled to the declared size
                rgb = reformatter.reformat(
                    frame, format="rgb24", width=width, height=height
                ).to_ndarray()
                # numpy's transposing copy: torch's is far slower on uint8 [H, W, 3] rows
                if (height, width) == size:
                    np.copyto(frames[num_kept].numpy(), rgb.transpose(2, 0, 1))
                else:
                    chw = torch.from_numpy(np.ascontiguousarray(rgb.transpose(2, 0, 1)))
                    frames[num_kept] = resize_bicubic(chw.unsqueeze(0), *size)[0]
                num_kept += 1
            num_decoded += 1
            if num_decoded > indices[-1]:
                break
    return frames[:num_kept], num_decoded


def video_to_patches(video: DecodedVideo, patch: PatchConfig) -> Patches:
    """Patchify decoded frames: frame pairs become temporal groups (an odd last frame repeats)."""
    return patchify(video.frames, patch)
