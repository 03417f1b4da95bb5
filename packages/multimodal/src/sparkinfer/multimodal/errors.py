"""Typed errors for bad media: each is a `MediaError` (a `ValueError`), a 400 `invalid_media`."""

from __future__ import annotations


class MediaError(ValueError):
    """A media part of a request cannot be used; the message names the part and what to do."""


class UnsupportedMediaSource(MediaError):
    """The media is not a `data:` URL (http, https, file and every other scheme are refused)."""


class InvalidDataUrl(MediaError):
    """The `data:` URL is malformed: no `;base64,` payload, or the payload is not valid base64."""


class UnsupportedMediaType(MediaError):
    """The declared MIME type, or the decoded container format, is not one this server reads."""


class MediaTooLarge(MediaError):
    """Encoded bytes, decoded pixels, duration or frame count exceed the server's `MediaLimits`."""


class UndecodableMedia(MediaError):
    """The bytes are corrupt or truncated, or the stream holds nothing decodable."""


class VideoUnavailable(MediaError):
    """Video was sent but PyAV (the `av` package) is not installed on the server."""


class PlaceholderMismatch(MediaError):
    """The prompt's image or video placeholders do not match the media sent with it."""
