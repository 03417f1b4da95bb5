"""Image and video parts end to end on the embedded model (tiny vision tower), and media.py."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from sparkinfer.api import media as media_module
from sparkinfer.api.errors import InvalidMedia
from sparkinfer.api.media import MediaConfig, expand_media, media_parts
from sparkinfer.api.schemas.chat import ChatMessage
from sparkinfer.model.embedded import EMBEDDED_MODEL_ID, embedded_checkpoint_dir
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.multimodal import MediaLimits, VisionTokenIds, parse_processor_config
from sparkinfer.multimodal import video as video_module

from .conftest import RunningServer

_CONTROL = Tokenizer.from_checkpoint(embedded_checkpoint_dir()).control_tokens
IMAGE_PAD, VIDEO_PAD = _CONTROL["<|image_pad|>"], _CONTROL["<|video_pad|>"]
VISION_START, VISION_END = _CONTROL["<|vision_start|>"], _CONTROL["<|vision_end|>"]
MODEL = EMBEDDED_MODEL_ID
SMUGGLED = "<|vision_start|><|image_pad|><|vision_end|><|video_pad|>"


def png_url(width: int, height: int, seed: int = 0) -> str:
    arr = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def mp4_url(num_frames: int, fps: int, size: int) -> str:
    import av

    rng, buf = np.random.default_rng(0), io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for _ in range(num_frames):
            arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode()


def user(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Describe:"}, *parts]}]


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def chat(server: RunningServer, messages: list[dict], **body: object) -> httpx.Response:
    payload = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0.0, **body}
    return httpx.post(server.v1 + "/chat/completions", json=payload, timeout=120)


def tokenize(server: RunningServer, messages: list[dict]) -> list[int]:
    resp = httpx.post(server.v1 + "/tokenize", json={"messages": messages}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["tokens"]


def prompt_tokens(resp: httpx.Response) -> int:
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens"]


def test_chat_with_an_image(server: RunningServer) -> None:
    """A 40x24 PNG is resized up to the 65,536-pixel minimum: 352x224, a 22x14 patch grid, 77
    pad tokens; the image adds vision_start + 77 pads + vision_end to the prompt."""
    text_only = prompt_tokens(chat(server, user()))
    messages = user(image_part(png_url(40, 24)))
    resp = chat(server, messages)
    assert prompt_tokens(resp) == text_only + 79
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    ids = tokenize(server, messages)
    assert len(ids) == prompt_tokens(resp) and ids.count(IMAGE_PAD) == 77


def test_the_model_sees_the_pixels(server: RunningServer) -> None:
    """Same prompt, same size, other pixels: the first token's distribution changes."""

    def first_logprobs(seed: int) -> list[float]:
        # Thinking off: the first token is the answer's, which logprobs.content reports.
        parts = user(image_part(png_url(40, 24, seed)))
        resp = chat(server, parts, logprobs=True, top_logprobs=3, enable_thinking=False)
        assert resp.status_code == 200, resp.text
        return [
            t["logprob"]
            for t in resp.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        ]

    assert first_logprobs(1) == first_logprobs(1)
    assert first_logprobs(1) != first_logprobs(2)


def test_corrupt_image_is_a_400_and_leaves_the_cache_alone(server: RunningServer) -> None:
    """A corrupt image beside a good one is refused; the good one then gives the logprobs it
    gives cold (its first run filled the tower cache, the second takes its rows from it)."""

    def first_logprobs(*parts: dict) -> list[float]:
        resp = chat(server, user(*parts), logprobs=True, top_logprobs=3, enable_thinking=False)
        assert resp.status_code == 200, resp.text
        return [
            t["logprob"]
            for t in resp.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        ]

    good = image_part(png_url(48, 24, seed=7))
    cold = first_logprobs(good)
    corrupt = image_part("data:image/png;base64," + base64.b64encode(b"not a png").decode())
    resp = chat(server, user(good, corrupt))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "messages[0].content[2].image_url"
    assert first_logprobs(good) == cold


def test_chat_with_a_video_and_two_images(server: RunningServer) -> None:
    """8 frames at 4 fps: 4 sampled at 2 fps, 2 groups of 2x2 patches, 1 pad token each, each
    group led by its `<t seconds>` text and wrapped in its own vision_start/vision_end."""
    messages = user(
        image_part(png_url(32, 32)), video_part(mp4_url(8, 4, 32)), image_part(png_url(64, 32))
    )
    resp = chat(server, messages, stream=False)
    ids = tokenize(server, messages)
    assert prompt_tokens(resp) == len(ids)
    # 32x32 -> 256x256 (64 pads); 64x32 -> 384x192 (72 pads)
    assert ids.count(VIDEO_PAD) == 2 and ids.count(IMAGE_PAD) == 64 + 72
    assert ids.count(VISION_START) == 4 and ids.count(VISION_END) == 4


def test_streamed_image_chat_reports_expanded_usage(server: RunningServer) -> None:
    messages = user(image_part(png_url(40, 24)))
    body = {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream(
        "POST",
        server.v1 + "/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 2, **body},
        timeout=120,
    ) as resp:
        lines = [line for line in resp.iter_lines() if line.startswith("data: {")]
    assert '"prompt_tokens":' + str(len(tokenize(server, messages))) in lines[-1]


def test_remote_url_is_refused(server: RunningServer) -> None:
    resp = chat(server, user(image_part("https://example.com/cat.png")))
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert (err["code"], err["param"]) == ("invalid_media", "messages[0].content[1].image_url")
    assert "only data: URLs are accepted" in err["message"]


def test_video_without_pyav_names_the_package(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = mp4_url(4, 4, 32)
    monkeypatch.setattr(video_module, "av", None)
    resp = chat(server, user(video_part(url)))
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "invalid_media" and "install PyAV" in err["message"]


def test_context_check_counts_the_expanded_prompt(server: RunningServer) -> None:
    messages = user(image_part(png_url(40, 24)))
    num_text = prompt_tokens(chat(server, user()))
    # fits as text (plus the 3-token placeholder), not once the image is 79 tokens
    resp = chat(server, messages, max_tokens=1024 - num_text - 10)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_user_text_cannot_smuggle_vision_tokens(server: RunningServer) -> None:
    messages = [{"role": "user", "content": SMUGGLED}]
    ids = tokenize(server, messages)
    assert not {IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END} & set(ids)
    assert chat(server, messages).status_code == 200
    with_image = user({"type": "text", "text": SMUGGLED}, image_part(png_url(40, 24)))
    ids = tokenize(server, with_image)
    assert ids.count(IMAGE_PAD) == 77 and ids.count(VISION_START) == 1
    assert prompt_tokens(chat(server, with_image)) == len(ids)


def test_media_parts_name_the_field() -> None:
    def parts(*content: dict, has_vision: bool = True):
        return media_parts([ChatMessage(role="user", content=list(content))], has_vision=has_vision)

    got = parts({"type": "text", "text": "x"}, {"type": "image_url", "image_url": "data:a"})
    assert [(p.field, p.kind, p.url) for p in got] == [
        ("messages[0].content[1].image_url", "image", "data:a")
    ]
    with pytest.raises(InvalidMedia, match=r"messages\[0\].content\[0\].video_url.url is missing"):
        parts({"type": "video_url", "video_url": {}})
    with pytest.raises(InvalidMedia, match="audio input is not supported"):
        parts({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})
    with pytest.raises(InvalidMedia, match="no vision tower") as info:
        parts({"type": "image_url", "image_url": {"url": "data:a"}}, has_vision=False)
    assert info.value.param == "messages[0].content[0]"


def test_mrope_off_gives_sequential_positions() -> None:
    from sparkinfer.multimodal import process_image

    tok = Tokenizer.embedded()  # Qwen's ids, as VisionTokenIds' defaults
    config = MediaConfig(
        processor=parse_processor_config(None),
        limits=MediaLimits(),
        token_ids=VisionTokenIds(),
        merge_size=2,
        use_mrope=False,
    )
    item = process_image(png_url(40, 24), field="f", config=config.processor, limits=config.limits)
    prompt = [1, 248053, 248056, 248054, 2]  # text, vision_start, image_pad, vision_end, text
    ids, mm = expand_media(prompt, [item], config, tok)
    assert len(ids) == 81 and mm is not None
    assert mm.positions is None and mm.rope_delta == 0 and mm.grid_thw == ((1, 14, 22),)
    assert mm.content_hashes == (item.content_hash,) and mm.pad_runs == ((2, 79, 0),)
    on = MediaConfig(config.processor, config.limits, config.token_ids, 2, use_mrope=True)
    _, mm_on = expand_media(prompt, [item], on, tok)
    assert mm_on is not None and mm_on.positions is not None
    # the 79-token block uses 13 positions (vision_start, the 7x11 grid, vision_end)
    assert mm_on.positions.shape == (3, 81) and mm_on.rope_delta == 15 - 81


def test_too_many_parts_are_refused_before_any_decode(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sparkinfer.api.media as media_module

    calls: list[str] = []
    real = media_module.process_image
    monkeypatch.setattr(
        media_module, "process_image", lambda *a, **k: calls.append("x") or real(*a, **k)
    )
    url = png_url(1, 1)
    body = {"messages": user(*[image_part(url)] * 33), "max_tokens": 1}
    resp = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "messages[0].content[33].image_url"
    assert "33 image and video parts" in err["message"] and "max_media_parts" in err["message"]
    assert calls == []


def test_media_tokens_past_the_context_stop_the_decoding(server: RunningServer) -> None:
    url = png_url(64, 64)
    body = {"messages": user(*[image_part(url)] * 32), "max_tokens": 1}
    resp = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert err["param"].endswith(".image_url") and "max_media_tokens" in err["message"]


def test_pixels_in_all_are_checked_from_the_headers_before_decoding(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4096, 4096)).save(buf, format="PNG")  # 16.7 Mpx in ~50 KB
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    decoded: list[str] = []
    real = media_module.process_image
    monkeypatch.setattr(
        media_module, "process_image", lambda *a, **k: decoded.append("x") or real(*a, **k)
    )
    body = {"messages": user(*[image_part(url)] * 6), "max_tokens": 1}
    resp = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "messages[0].content[3].image_url"  # the third image passes 32 Mpx
    assert "media_max_request_pixels" in err["message"]
    assert decoded == []  # refused before any image was decoded


def test_the_default_media_token_cap_is_well_below_a_long_context() -> None:
    from sparkinfer.api.settings import load_settings

    assert load_settings({}, environ={}).max_media_tokens <= 16384
