"""Bounded encoding: pieces joined give the whole text's ids; a budget stops early."""

from __future__ import annotations

import random

import pytest
from sparkinfer.model.bounded_encode import PIECE_CHARS, TokenBudgetExceeded, encode_bounded
from sparkinfer.model.embedded import embedded_checkpoint_dir
from sparkinfer.model.tokenizer import PromptSegment, Tokenizer

WORDS = ["hello", "naïve", "café", "日本語", "x2", "²", "'s", "don't", "  ", "\n", "\t", "é", "42"]


@pytest.fixture(scope="module", params=["embedded", "tokenizer.json"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    if request.param == "embedded":
        return Tokenizer.embedded()
    return Tokenizer.from_checkpoint(embedded_checkpoint_dir())


def _text(seed: int, num_words: int) -> str:
    rng = random.Random(seed)
    tails = ["", ",", ".", "e\u0301"]
    return " ".join(rng.choice(WORDS) + rng.choice(tails) for _ in range(num_words))


@pytest.mark.parametrize("seed", [0, 1])
def test_pieces_give_the_whole_texts_ids(tokenizer: Tokenizer, seed: int) -> None:
    text = _text(seed, PIECE_CHARS // 2)  # several pieces
    whole = tokenizer._vocab.encode_all([text])[0]  # pyright: ignore[reportPrivateUsage]
    assert tokenizer.encode(text, allow_special=True) == whole


def test_a_run_without_spaces_is_exact(tokenizer: Tokenizer) -> None:
    text = "ab日" * PIECE_CHARS  # no safe cut anywhere: forced cuts, then one whole encode
    whole = tokenizer._vocab.encode_plain([text])[0]  # pyright: ignore[reportPrivateUsage]
    assert tokenizer.encode(text) == whole


def test_a_budget_stops_after_the_first_calls(tokenizer: Tokenizer) -> None:
    calls: list[int] = []

    def counting(texts: list[str]) -> list[list[int]]:
        calls.append(sum(map(len, texts)))
        return tokenizer._vocab.encode_plain(texts)  # pyright: ignore[reportPrivateUsage]

    text = "hello world " * 1_000_000  # 12 MB
    with pytest.raises(TokenBudgetExceeded) as info:
        encode_bounded(text, counting, 1000)
    assert info.value.max_tokens == 1000
    assert sum(calls) < 8 * PIECE_CHARS  # one call of a few pieces, not 12 MB


def test_encode_chat_counts_its_budget_over_segments(tokenizer: Tokenizer) -> None:
    segments = [PromptSegment("<|im_start|>", True), PromptSegment("hi " * 600, False)]
    ids = tokenizer.encode_chat(segments)
    assert tokenizer.encode_chat(segments, max_tokens=len(ids)) == ids
    with pytest.raises(TokenBudgetExceeded):
        tokenizer.encode_chat(segments, max_tokens=len(ids) - 1)
