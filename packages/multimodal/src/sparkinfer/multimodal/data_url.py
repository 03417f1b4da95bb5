"""`data:` URLs: the only way media enters the server, checked against `MediaLimits` first.

Remote URLs (http, https, ftp, file, ...) are refused: fetching them on a client's behalf would let
any client make the server open connections or files of its choosing (server-side request forgery).
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Collection
from dataclasses import dataclass, field, fields

from sparkinfer.multimodal.errors import (
    InvalidDataUrl,
    MediaTooLarge,
    UnsupportedMediaSource,
    UnsupportedMediaType,
)

_WHITESPACE = b" \t\r\n"  # deleted from a payload that is not strict base64 as sent
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31}):")


HELP = "help"  # the metadata key of each MediaLimits field's description


@dataclass(frozen=True)
class MediaLimits:
    """Per-request media limits; the api builds one from its settings and passes it down.

    Each field's default and description (metadata `HELP`) are the server's: its settings take
    them from here (`sparkinfer.api.settings.media_setting`), so a limit is declared once.
    """

    max_bytes: int = field(
        default=20 * 1024 * 1024,
        metadata={HELP: "Largest decoded data: URL payload of one media part"},
    )
    max_image_pixels: int = field(
        default=50_000_000,
        metadata={
            HELP: "Largest width x height of an image or video frame, read from the header "
            "before any pixel is decoded"
        },
    )
    max_video_seconds: float = field(default=600.0, metadata={HELP: "Longest video in seconds"})
    max_video_source_frames: int = field(
        default=36_000,
        metadata={
            HELP: "Most frames in one source video stream, counted before decoding (bounds "
            "decode work); sampling then keeps at most video_max_frames"
        },
    )
    max_decode_seconds: float = field(
        default=30.0,
        metadata={HELP: "Seconds one video may take to decode before it is refused"},
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ValueError(f"MediaLimits.{f.name} is {value!r}; it must be > 0")


@dataclass(frozen=True)
class DataUrl:
    """A decoded `data:` URL: its lower-cased MIME type (no parameters) and payload bytes."""

    mime_type: str
    data: bytes


def parse_data_url(
    url: str, *, field: str, allowed_types: Collection[str], limits: MediaLimits
) -> DataUrl:
    """Decode `data:<mime>[;param...];base64,<payload>`, refusing anything else.

    Args:
        url: the URL string from the request.
        field: where the URL sits in the request (e.g. `messages[0].content[1].image_url`),
            used in every error message.
        allowed_types: MIME types accepted for this part (lower case).
        limits: size limits; the payload's length is checked before it is decoded.
    Returns:
        DataUrl with the MIME type and the decoded bytes.
    """
    if not isinstance(url, str) or url[:5].lower() != "data:":
        match = _SCHEME.match(url) if isinstance(url, str) else None
        what = f"a {match.group(1).lower()}: URL" if match else "not a data: URL"
        raise UnsupportedMediaSource(
            f"{field} is {what}; only data: URLs are accepted (the server never fetches remote "
            f"or local URLs): embed the file as data:<mime type>;base64,<base64 bytes>"
        )
    comma = url.find(",", 5)  # slicing once: the payload can be tens of megabytes
    if comma < 0:
        raise InvalidDataUrl(f"{field} is a data: URL without a ',' before its payload")
    header, payload = url[5:comma], url[comma + 1 :]
    params = [p.strip() for p in header.split(";")]
    mime_type = params[0].lower()
    if "base64" not in (p.lower() for p in params[1:]):
        raise InvalidDataUrl(
            f"{field} is a data: URL without ';base64': encode the file as "
            f"data:{mime_type or '<mime type>'};base64,<base64 bytes>"
        )
    if mime_type not in allowed_types:
        raise UnsupportedMediaType(
            f"{field} has MIME type {mime_type or '(none)'!r}; accepted here: "
            f"{', '.join(sorted(allowed_types))}: convert the file or declare its real type"
        )
    # base64 inflates by 4/3: refuse an oversized payload before decoding it
    if len(payload) // 4 * 3 > limits.max_bytes + 3:
        raise MediaTooLarge(
            f"{field} carries about {len(payload) // 4 * 3} bytes of media; the limit is "
            f"{limits.max_bytes} bytes: send a smaller or more compressed file"
        )
    data = _decode_base64(payload, field)
    if len(data) > limits.max_bytes:
        raise MediaTooLarge(
            f"{field} carries {len(data)} bytes of media; the limit is {limits.max_bytes} "
            f"bytes: send a smaller or more compressed file"
        )
    if not data:
        raise InvalidDataUrl(f"{field} is a data: URL with an empty payload: send the file's bytes")
    return DataUrl(mime_type=mime_type, data=data)


def _decode_base64(payload: str, field: str) -> bytes:
    """Strict standard base64; whitespace (line breaks) and stripped padding are tolerated.

    Well-formed payloads, nearly all of them, take one strict decode; only one that fails it
    pays for the whitespace strip and padding repair, then gets the same strict decode.
    """
    try:
        raw = payload.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidDataUrl(
            f"{field} has non-ASCII characters in its base64 payload: send standard base64"
        ) from None
    try:
        return binascii.a2b_base64(raw, strict_mode=True)
    except binascii.Error:
        pass
    raw = raw.translate(None, _WHITESPACE)
    raw += b"=" * (-len(raw) % 4)  # tolerate stripped padding
    try:
        return binascii.a2b_base64(raw, strict_mode=True)
    except (binascii.Error, ValueError):
        raise InvalidDataUrl(
            f"{field} has an invalid base64 payload: send the file encoded with standard "
            f"base64 (A-Z a-z 0-9 + /, '=' padding)"
        ) from None
