"""Media of the `vision` benchmark, made in the run, and their preprocessing time on the CPU.

Images are PNGs of a colour gradient with seeded noise; the clip is an H.264 MP4 (yuv420p)
encoded with PyAV, whose frames change colour over time. Both go through
`sparkinfer.multimodal`'s `process_image` / `process_video` as `data:` URLs, exactly as the api
hands a request's media parts to them.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image
from sparkinfer.bench.timing import Timing, time_cpu
from sparkinfer.multimodal.data_url import MediaLimits
from sparkinfer.multimodal.processor import (
    ProcessedMedia,
    ProcessorConfig,
    process_image,
    process_video,
)

PROCESSOR = ProcessorConfig()  # the checkpoint's preprocessor defaults; video sampled at 2 fps
LIMITS = MediaLimits()


@dataclass(frozen=True)
class Case:
    """One benchmarked input: an image, or a clip of `seconds` at `fps` frames per second."""

    name: str
    kind: Literal["image", "video"]
    width: int
    height: int
    expected_grid: tuple[int, int, int]  # (t, h, w) in patches after resize and sampling
    seconds: float = 0.0
    fps: int = 0


# model.md §9: worked example 1 (196 tokens), worked example 2 (1,176 tokens), a 12,544-patch image
FULL_CASES = (
    Case("image 448x448", "image", 448, 448, (1, 28, 28)),
    Case("video 6 s 448x448 30 fps", "video", 448, 448, (6, 28, 28), seconds=6.0, fps=30),
    Case("image 1792x1792", "image", 1792, 1792, (1, 112, 112)),
)
# --tiny: the same three kinds at sizes a CPU handles in well under a second
TINY_CASES = (
    Case("image 256x256", "image", 256, 256, (1, 16, 16)),
    Case("video 2 s 64x64 10 fps", "video", 64, 64, (2, 4, 4), seconds=2.0, fps=10),
    Case("image 512x512", "image", 512, 512, (1, 32, 32)),
)


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_bytes(width: int, height: int, *, seed: int) -> bytes:
    """PNG of a diagonal colour gradient plus seeded noise (compresses like a photo, not noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / max(width - 1, 1), y * 255 / max(height - 1, 1), (x + y) % 256], -1)
    noisy = base + rng.normal(0, 12, base.shape)
    buf = io.BytesIO()
    Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB").save(buf, format="PNG")
    return buf.getvalue()


def clip_bytes(seconds: float, fps: int, width: int, height: int) -> bytes:
    """H.264 MP4 whose frames differ (red channel changes per frame over two ramps)."""
    import av

    ramp = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    column = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(round(seconds * fps)):
            arr = np.empty((height, width, 3), np.uint8)
            arr[..., 0] = (i * 7) % 256
            arr[..., 1] = ramp
            arr[..., 2] = column
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def media_url(case: Case, *, seed: int) -> tuple[str, int]:
    """The case's `data:` URL and the size of its encoded file in bytes."""
    if case.kind == "image":
        data = image_bytes(case.width, case.height, seed=seed)
        return _data_url("image/png", data), len(data)
    data = clip_bytes(case.seconds, case.fps, case.width, case.height)
    return _data_url("video/mp4", data), len(data)


def preprocess(case: Case, url: str, *, warmup: int, iters: int) -> tuple[ProcessedMedia, Timing]:
    """Process the URL once for its tensors, then time `iters` calls after `warmup` untimed ones.

    The time covers base64 decoding, image or video decoding, frame sampling, resize,
    normalisation and patchify: everything between the request body and the vision tower.
    """
    process = process_image if case.kind == "image" else process_video

    def call() -> ProcessedMedia:
        return process(url, field=case.name, config=PROCESSOR, limits=LIMITS)

    media = call()
    return media, time_cpu(call, warmup=warmup, iters=iters)
