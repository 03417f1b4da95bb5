"""Stop strings over streamed text: emit what cannot start a stop, cut at the first match."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Holds back the tail that could still start a stop string; `feed` returns the safe text.

    After a match, `is_stopped` is True, the output ends just before the stop string (it is
    trimmed, as OpenAI does) and later input is ignored.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
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
        keep = self._held_tail_len(buf)
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

    def _held_tail_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop string."""
        for n in range(min(self._hold, len(buf)), 0, -1):
            tail = buf[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0
