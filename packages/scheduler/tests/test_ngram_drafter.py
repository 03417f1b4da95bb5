"""Prompt lookup: the longest trailing n-gram's latest earlier occurrence, bounded."""

from sparkinfer.scheduler.speculative.ngram_drafter import propose_ngram


def test_the_tokens_after_the_latest_match_of_the_longest_suffix():
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 6, 7, 2, 3]
    # Suffix [2, 3] last occurred at 6-7, followed by 4 5 6; [7, 2, 3] never occurred before.
    assert propose_ngram(tokens, 3) == [4, 5, 6]
    assert propose_ngram(tokens, 1) == [4]
    assert propose_ngram([*tokens, 4], 2) == [5, 6]  # [2, 3, 4] beats the shorter matches


def test_no_match_no_drafts_and_drafts_end_with_the_tokens():
    assert propose_ngram([1, 2, 3, 4, 5], 3) == []
    assert propose_ngram([1, 2], 3) == []
    assert propose_ngram([5, 6, 5, 6], 4) == [5, 6]  # the match's continuation runs into the end
    assert propose_ngram([1, 2, 1, 2], 0) == []


def test_only_the_window_is_searched():
    tokens = [7, 8, 9, *range(100, 200), 7, 8]
    assert propose_ngram(tokens, 1) == [9]
    assert propose_ngram(tokens, 1, window=50) == []
