"""Prompt-lookup drafts: the tokens that followed the last earlier occurrence of the request's
own trailing n-gram (no weights, no device; strong on code, JSON, edits and repetition).

The longest suffix of `NGRAM_MAX_LEN` down to `NGRAM_MIN_LEN` tokens that occurred before wins,
its most recent occurrence first: a recent match is the likeliest to continue the same way.
Only the last `NGRAM_WINDOW` tokens are searched, so a draft costs the host a bounded time
(about 50 us at 8K tokens) however long the context grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq

NGRAM_MAX_LEN = 4
NGRAM_MIN_LEN = 2
NGRAM_WINDOW = 8192


def propose_ngram(
    token_ids: Sequence[int],
    num_drafts: int,
    *,
    max_len: int = NGRAM_MAX_LEN,
    min_len: int = NGRAM_MIN_LEN,
    window: int = NGRAM_WINDOW,
) -> list[int]:
    """Up to `num_drafts` tokens to follow `token_ids` (possibly none)."""
    if num_drafts < 1 or len(token_ids) <= min_len:
        return []
    tokens = np.asarray(token_ids[-window:], dtype=np.int64)
    n_tokens = len(tokens)
    for n in range(min(max_len, n_tokens - 1), min_len - 1, -1):
        suffix = tokens[n_tokens - n :]
        # Starts i of earlier windows tokens[i : i + n] that equal the suffix (not the suffix
        # itself): compare column by column, narrowing the candidates.
        starts = np.flatnonzero(tokens[: n_tokens - n] == suffix[0])
        for offset in range(1, n):
            starts = starts[tokens[starts + offset] == suffix[offset]]
        if len(starts):
            begin = int(starts[-1]) + n
            return tokens[begin : begin + num_drafts].tolist()
    return []


class NgramDrafter:
    """The n-gram drafter (`drafter.Drafter`): drafts from host tokens, keeps no state."""

    needs_hidden = False
    needs_taps = False

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        """Drafts for each decode row (its request's tokens are all on the host)."""
        return [
            propose_ngram(s.req.token_ids, k) if k else []
            for s, k in zip(seqs, num_drafts, strict=True)
        ]

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool:
        """Never: it drafts from host tokens, which the scheduler has before it drafts."""
        return False

    def observe(self, step: object) -> None:
        """Nothing to learn from the target's step."""
