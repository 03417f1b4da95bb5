"""Encoding long text in pieces, off Python's global lock, stopping once a token budget is passed.

A backend encodes a batch of strings in native code that releases the global lock (`tokenizers`'
`encode_batch`, tiktoken's `encode_ordinary`), so other threads (the server's event loop) keep
running while a long prompt is encoded. Text is cut into pieces of about PIECE_CHARS characters,
encoded a few pieces per call, and encoding stops as soon as the count passes `max_tokens`: a
30 MB prompt for a 32K context costs one or two calls, not the whole text.

Cuts fall where a letter (or number) is followed by a space and a letter: there the Qwen
pre-tokenizer always ends one piece and starts the next, and NFC never composes across a space,
so the pieces' ids joined are the whole text's ids. Text with no such place in a window (a long
run without spaces) is cut at the window's end; such a cut may change a token or two, so text
with forced cuts that fits the budget is encoded once more, whole, for exact ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

PIECE_CHARS = 1 << 15  # characters per piece (~8K tokens of prose)
PIECES_PER_CALL = 4  # pieces handed to the backend in one lock-free call
# A letter or number (not `_`), a space, a letter: the pre-tokenizer's pieces end at the space.
_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W\d_])")

BatchEncode = Callable[[list[str]], list[list[int]]]


class TokenBudgetExceeded(ValueError):
    """The text has more than `max_tokens` tokens (`num_counted`: counted before stopping)."""

    def __init__(self, max_tokens: int, num_counted: int) -> None:
        super().__init__(
            f"text has more than {max_tokens} tokens ({num_counted} counted before stopping): "
            "shorten it"
        )
        self.max_tokens = max_tokens
        self.num_counted = num_counted


class _Piece(NamedTuple):
    text: str
    is_exact_cut: bool  # False: cut inside a run without a safe place


def _pieces(text: str) -> Iterator[_Piece]:
    start = 0
    while len(text) - start > PIECE_CHARS:
        end = start + PIECE_CHARS
        cut = None
        for m in _CUT.finditer(text, start + PIECE_CHARS // 2, end):
            cut = m.start()
        if cut is None:
            yield _Piece(text[start:end], False)
            start = end
        else:
            yield _Piece(text[start:cut], True)
            start = cut
    yield _Piece(text[start:], True)


def encode_bounded(text: str, encode_batch: BatchEncode, max_tokens: int | None) -> list[int]:
    """`text`'s ids, encoded a few pieces per lock-free call; `TokenBudgetExceeded` as soon as
    the count passes `max_tokens` (None: no budget)."""
    if len(text) <= PIECE_CHARS:
        ids = encode_batch([text])[0]
        if max_tokens is not None and len(ids) > max_tokens:
            raise TokenBudgetExceeded(max_tokens, len(ids))
        return ids
    ids: list[int] = []
    num_forced = 0
    batch: list[str] = []
    pieces = _pieces(text)
    for piece in pieces:
        batch.append(piece.text)
        num_forced += not piece.is_exact_cut
        if len(batch) < PIECES_PER_CALL:
            continue
        for part in encode_batch(batch):
            ids += part
        batch = []
        # A forced cut may split one token in two: allow that much before refusing.
        if max_tokens is not None and len(ids) - num_forced > max_tokens:
            raise TokenBudgetExceeded(max_tokens, len(ids) - num_forced)
    for part in encode_batch(batch) if batch else []:
        ids += part
    if max_tokens is not None and len(ids) - num_forced > max_tokens:
        raise TokenBudgetExceeded(max_tokens, len(ids) - num_forced)
    if num_forced:
        ids = encode_batch([text])[0]
        if max_tokens is not None and len(ids) > max_tokens:
            raise TokenBudgetExceeded(max_tokens, len(ids))
    return ids
