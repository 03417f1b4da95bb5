"""Media made in the tests: PNG, RGBA, GIF images and small PyAV clips, as bytes or data URLs."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image


def _image_bytes(width: int, height: int, *, mode: str = "RGB", fmt: str = "PNG", seed: int = 0):
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4}.get(mode, 3)
    arr = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    img = Image.fromarray(arr, "RGBA" if channels == 4 else "RGB")
    if mode == "P":
        img = img.convert("P")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def _clip_bytes(
    seconds: float,
    fps: int,
    width: int,
    height: int,
    *,
    codec: str = "libx264",
    fmt: str = "mp4",
    noise: bool = True,
) -> bytes:
    """A clip whose frames differ (changing colour, a ramp, optional noise), encoded in memory."""
    import av

    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    column = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(round(seconds * fps)):
            arr = np.empty((height, width, 3), np.uint8)
            arr[..., 0] = (i * 7) % 256
            arr[..., 1] = ramp
            arr[..., 2] = rng.integers(0, 256, (height, width)) if noise else column
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="session")
def image_bytes() -> Callable[..., bytes]:
    return _image_bytes


@pytest.fixture(scope="session")
def clip_bytes() -> Callable[..., bytes]:
    cache: dict[tuple, bytes] = {}

    def make(*args, **kwargs) -> bytes:
        key = (*args, *sorted(kwargs.items()))
        if key not in cache:
            cache[key] = _clip_bytes(*args, **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def data_url() -> Callable[[str, bytes], str]:
    return _data_url
