"""data: URLs only: remote schemes, malformed URLs, bad base64, wrong MIME and oversize refused."""

from __future__ import annotations

import base64
import binascii
import random
import re

import pytest
from sparkinfer.multimodal.data_url import MediaLimits, parse_data_url
from sparkinfer.multimodal.errors import (
    InvalidDataUrl,
    MediaError,
    MediaTooLarge,
    UnsupportedMediaSource,
    UnsupportedMediaType,
)

FIELD = "messages[0].content[1].image_url"
IMAGES = {"image/png", "image/jpeg"}
LIMITS = MediaLimits()


def parse(url: str, limits: MediaLimits = LIMITS):
    return parse_data_url(url, field=FIELD, allowed_types=IMAGES, limits=limits)


def test_parse_data_url_decodes_payload() -> None:
    got = parse("data:image/png;base64," + base64.b64encode(b"\x89PNG abc").decode())
    assert got.mime_type == "image/png"
    assert got.data == b"\x89PNG abc"


def test_parse_data_url_tolerates_case_params_whitespace_and_missing_padding() -> None:
    payload = base64.b64encode(b"hello!!").decode()  # 'aGVsbG8hIQ=='
    url = f"DATA:Image/PNG;name=a.png;BASE64,{payload[:4]}\n{payload[4:].rstrip('=')}"
    got = parse(url)
    assert got.mime_type == "image/png"
    assert got.data == b"hello!!"


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("http://169.254.169.254/latest/meta-data", "http"),
        ("https://example.com/cat.png", "https"),
        ("file:///etc/passwd", "file"),
        ("ftp://host/x.png", "ftp"),
        ("gopher://host/x", "gopher"),
    ],
)
def test_parse_data_url_refuses_remote_and_local_urls(url: str, scheme: str) -> None:
    with pytest.raises(UnsupportedMediaSource) as err:
        parse(url)
    msg = str(err.value)
    assert msg.startswith(FIELD)
    assert f"a {scheme}: URL" in msg
    assert "only data: URLs" in msg
    assert "169.254" not in msg  # the URL itself is not echoed


@pytest.mark.parametrize("url", ["", "/tmp/cat.png", "cat.png", "//host/cat.png"])
def test_parse_data_url_refuses_non_urls(url: str) -> None:
    with pytest.raises(UnsupportedMediaSource, match="not a data: URL"):
        parse(url)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("data:image/png;base64", "without a ','"),
        ("data:image/png,rawbytes", "without ';base64'"),
        ("data:image/png;base64,@@@@", "invalid base64"),
        ("data:image/png;base64,aGVsbG8-_w", "invalid base64"),
        ("data:image/png;base64,a", "invalid base64"),
        ("data:image/png;base64,é", "non-ASCII"),
        ("data:image/png;base64,", "empty payload"),
    ],
)
def test_parse_data_url_refuses_malformed(url: str, match: str) -> None:
    with pytest.raises(InvalidDataUrl, match=match) as err:
        parse(url)
    assert isinstance(err.value, ValueError)
    assert str(err.value).startswith(FIELD)


@pytest.mark.parametrize("mime", ["video/mp4", "application/pdf", "text/html", "image/svg+xml", ""])
def test_parse_data_url_refuses_wrong_mime(mime: str) -> None:
    with pytest.raises(UnsupportedMediaType, match=r"accepted here: image/jpeg, image/png"):
        parse(f"data:{mime};base64,aGVsbG8=")


def test_parse_data_url_refuses_oversized_before_and_after_decoding() -> None:
    limits = MediaLimits(max_bytes=100)
    just_fits = base64.b64encode(b"x" * 100).decode()
    assert len(parse("data:image/png;base64," + just_fits, limits).data) == 100
    with pytest.raises(MediaTooLarge, match="101 bytes of media; the limit is 100"):
        parse("data:image/png;base64," + base64.b64encode(b"x" * 101).decode(), limits)
    # far too large: refused from the payload length alone (the payload is not even valid)
    with pytest.raises(MediaTooLarge, match="about 7500 bytes"):
        parse("data:image/png;base64," + "!" * 10_000, limits)


def test_media_errors_are_value_errors() -> None:
    assert issubclass(MediaError, ValueError)


@pytest.mark.parametrize("field", ["max_bytes", "max_image_pixels", "max_video_seconds"])
def test_media_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=f"MediaLimits.{field} is 0"):
        MediaLimits(**{field: 0})


def _strip_then_strict(payload: str) -> bytes:
    """The payload rule spelled out slowly: drop whitespace, restore padding, strict base64."""
    raw = re.sub(rb"[ \t\r\n]+", b"", payload.encode("ascii"))
    return binascii.a2b_base64(raw + b"=" * (-len(raw) % 4), strict_mode=True)


def test_base64_fast_path_accepts_and_refuses_exactly_what_the_rule_does() -> None:
    """The strict decode tried first must not widen or narrow what a payload may be."""
    rng = random.Random(0)
    alphabet = "AQgw+/=\n \r\t"
    payloads = ["QQ", "QQ=", "QQ==", "QR==", "QQQ", "Q", "=QQQ", "QQ==QQ==", "QQ\n==", "Q Q=="]
    payloads += ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(3000)]
    for payload in payloads:
        try:
            want: bytes | None = _strip_then_strict(payload)
        except binascii.Error:
            want = None
        try:
            got: bytes | None = parse("data:image/png;base64," + payload).data
        except InvalidDataUrl:
            got = None
        assert got == (want or None), payload
