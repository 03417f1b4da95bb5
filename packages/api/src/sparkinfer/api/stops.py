"""Stop strings over streamed text: emit what cannot start a stop, cut at the first match."""

from __future__ import annotations

from collections.abc import Sequence


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (may become it)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class StopStringMatcher:
    """Holds back the tail that could still start a stop string; `feed` returns the safe text.

    After a match, `is_stopped` is True, the output ends just before the stop string (it is
    trimmed, as OpenAI does) and later input is ignored.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._pending = ""
        self.is_stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add decoded text; return the part that is now certain to be output."""
        if self.is_stopped or not text:
            return ""
        if not self._stops:
            return text
        buf = self._pending + text
        first = self._first_match(buf)
        if first is not None:
            idx, stop = first
            self.is_stopped, self.matched, self._pending = True, stop, ""
            return buf[:idx]
        keep = max(partial_tag_len(buf, stop) for stop in self._stops)
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The held-back text, once the stream ends without a match."""
        out, self._pending = ("" if self.is_stopped else self._pending), ""
        return out

    def _first_match(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            idx = buf.find(stop)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, stop)
        return best
