"""Content logprobs: only the tokens that spell the content, however the parsers cut it."""

from __future__ import annotations

from sparkinfer.api.content_logprobs import ContentLogprobs
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.request import TokenLogprob


def _entries(tokenizer: Tokenizer, text: str) -> list[TokenLogprob]:
    ids = tokenizer.encode(text, allow_special=True)
    return [TokenLogprob(token_id=t, logprob=-float(i)) for i, t in enumerate(ids)]


def _spelled(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> str:
    return b"".join(tokenizer.token_bytes(e.token_id) for e in entries).decode()


def test_reasoning_and_the_newlines_after_it_are_left_out() -> None:
    tokenizer = Tokenizer.embedded()
    lp = ContentLogprobs(tokenizer, is_thinking=True)
    lp.push(_entries(tokenizer, "I think so.</think>\n\nYes, 42 ünits."))
    taken = lp.take("Yes, 4")
    assert _spelled(tokenizer, taken) in ("Yes, ", "Yes, 4")
    taken += lp.finish("Yes, 42 ünits.")
    assert _spelled(tokenizer, taken) == "Yes, 42 ünits."


def test_markup_the_parser_dropped_is_skipped_and_held_text_waits() -> None:
    tokenizer = Tokenizer.embedded()
    lp = ContentLogprobs(tokenizer, is_thinking=False)
    call = "<tool_call>\n<function=f>\n</function>\n</tool_call>"
    lp.push(_entries(tokenizer, "Checking." + call + "<|im_end|>"))
    assert lp.take("") == []  # nothing released yet: nothing handed out
    assert _spelled(tokenizer, lp.finish("Checking.")) == "Checking."
