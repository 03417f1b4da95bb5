"""The `image-chat` mode: TTFT of an image question over HTTP, cold and on the second turn.

Each round uses a fresh seeded image, so its first turn is truly cold, and sends four chats:

1. image cold: [user: image + question].
2. image turn 2: that turn, its answer and a new question, with the same image bytes. A server
   that caches vision-tower outputs and lets media prompts into its prefix cache prefills only
   the new text here.
3. text cold: [user: random words + the same question], the words sized so the server counts
   about as many prompt tokens as for the image turn (re-sent with a fresh opener until within
   `TOLERANCE_TOKENS`).
4. text turn 2: the text conversation continued like the image one (its own answer, the same new
   question): a text-only turn of about turn 2's length with its prefix just as warm.

The gate compares medians of 2 and 4: media should cost nothing on a second turn. TTFT is the
time to the first content or reasoning delta, as `client.py` measures it for every mode.
"""

from __future__ import annotations

import base64
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from sparkinfer.bench import corpus
from sparkinfer.bench.client import GenRequest, OpenAIClient, RequestResult
from sparkinfer.bench.errors import ServerError, UsageError
from sparkinfer.bench.report import Gate, Plot, Table, fmt, log
from sparkinfer.bench.vision_media import image_bytes

QUESTION = "Describe this picture in one sentence."
FOLLOW_UP = "Now name its two most common colours."
# The goal: an image conversation's second turn within 10% of a text-only one.
MAX_RATIO = 1.10
TOLERANCE_TOKENS = 4
MAX_SIZING_ATTEMPTS = 4
MIN_IMAGE_SIZE = 28  # one merged 2x2 group of 14-pixel patches


@dataclass(frozen=True)
class Turn:
    """One timed chat: TTFT and the server's usage figures."""

    ttft_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None

    @property
    def ttft_ms(self) -> float | None:
        return None if self.ttft_s is None else self.ttft_s * 1e3


@dataclass(frozen=True)
class RoundRow:
    """The four turns of one round (see the module docstring)."""

    round_idx: int
    image_cold: Turn
    image_warm: Turn
    text_cold: Turn
    text_warm: Turn

    @property
    def ratio(self) -> float | None:
        return _ratio(self.image_warm.ttft_s, self.text_warm.ttft_s)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio}


def check_args(image_size: int, num_rounds: int) -> None:
    """Raise UsageError for an image too small to make one vision token, or no rounds."""
    if image_size < MIN_IMAGE_SIZE:
        raise UsageError(f"--image-size is {image_size}; it must be >= {MIN_IMAGE_SIZE}")
    if num_rounds < 1:
        raise UsageError(f"--rounds is {num_rounds}; it must be >= 1")


def image_message(image_size: int, seed: int, text: str) -> dict[str, Any]:
    """A user message with a seeded PNG (base64 data URL) followed by `text`."""
    png = image_bytes(image_size, image_size, seed=seed)
    url = f"data:image/png;base64,{base64.b64encode(png).decode()}"
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {"role": "user", "content": content}


def text_message(opener: str, num_words: int, rng_seed: int) -> dict[str, Any]:
    """A user message of `num_words` random words after `opener`, then the question.

    The same `rng_seed` gives the same word sequence, so one more word adds about one token.
    """
    words = corpus.random_words(num_words, random.Random(rng_seed))
    return {"role": "user", "content": f"{opener} {words}\n\n{QUESTION}"}


def second_turn(first: dict[str, Any], answer: str) -> list[dict[str, Any]]:
    """The conversation after `first` was answered with `answer`, asking the follow-up."""
    return [first, {"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]


async def _chat(
    client: OpenAIClient, messages: list[dict[str, Any]], turn: str, max_tokens: int, seed: int
) -> RequestResult:
    """Stream one chat; a server error or a reply with no delta raises, naming the turn."""
    res = await client.generate(GenRequest(messages=messages, max_tokens=max_tokens, seed=seed))
    if res.error is not None:
        raise ServerError(f"{turn} failed: {res.error}")
    if res.ttft_s is None:
        raise ServerError(f"{turn}: the stream carried no content or reasoning delta")
    if res.prompt_tokens is None:
        raise ServerError(
            f"{turn}: the server reported no usage.prompt_tokens (stream_options include_usage); "
            "image-chat needs it to size the text-only turns"
        )
    return res


def _turn(res: RequestResult) -> Turn:
    return Turn(res.ttft_s, res.prompt_tokens, res.cached_tokens)


async def _sized_text_turn(
    client: OpenAIClient, target_tokens: int, round_idx: int, *, max_tokens: int, seed: int
) -> tuple[dict[str, Any], RequestResult]:
    """Text cold turn resized until its prompt is within TOLERANCE_TOKENS of `target_tokens`.

    Word counts follow the secant through the last two attempts (a proportional guess after the
    first), since tokens per word depend on the server's tokenizer; the words are one seeded
    sequence, so more words never means fewer tokens. Each attempt starts with its own opener, so
    the one kept was as cold as the image turn.
    """
    rng_seed = seed * 7_919 + round_idx
    tried: list[tuple[int, int]] = []  # (words, prompt tokens)
    num_words = target_tokens
    while True:
        # Fixed-width digits: a cache-busting opener whose token count does not vary.
        opener = f"[{seed:09d}-{round_idx:04d}-{len(tried):02d}]"
        message = text_message(opener, num_words, rng_seed)
        turn = f"round {round_idx + 1}, text cold turn (attempt {len(tried) + 1})"
        res = await _chat(client, [message], turn, max_tokens, seed)
        assert res.prompt_tokens is not None  # _chat checked it
        tried.append((num_words, res.prompt_tokens))
        is_close = abs(target_tokens - res.prompt_tokens) <= TOLERANCE_TOKENS
        if is_close or len(tried) == MAX_SIZING_ATTEMPTS:
            return message, res
        num_words = next_word_count(tried, target_tokens)


def next_word_count(tried: list[tuple[int, int]], target_tokens: int) -> int:
    """The word count expected to give `target_tokens`, from (words, tokens) attempts so far."""
    (w1, t1), (w0, t0) = tried[-1], tried[-2] if len(tried) > 1 else (0, 0)
    slope = (t1 - t0) / (w1 - w0) if w1 != w0 and t1 != t0 else max(t1, 1) / max(w1, 1)
    return max(1, round(w1 + (target_tokens - t1) / slope))


async def run_round(
    client: OpenAIClient, round_idx: int, *, image_size: int, max_tokens: int, seed: int
) -> RoundRow:
    """The four turns of one round, in the order the module docstring gives."""
    name = f"round {round_idx + 1}"
    log(f"image-chat: {name}: image turns, then the text-only twins")
    first = image_message(image_size, seed * 1_000 + round_idx, QUESTION)
    cold = await _chat(client, [first], f"{name}, image cold turn", max_tokens, seed)
    warm = await _chat(
        client, second_turn(first, cold.text), f"{name}, image second turn", max_tokens, seed
    )
    assert cold.prompt_tokens is not None  # _chat checked it
    text_first, text_cold = await _sized_text_turn(
        client, cold.prompt_tokens, round_idx, max_tokens=max_tokens, seed=seed
    )
    text_warm = await _chat(
        client,
        second_turn(text_first, text_cold.text),
        f"{name}, text second turn",
        max_tokens,
        seed,
    )
    return RoundRow(round_idx + 1, _turn(cold), _turn(warm), _turn(text_cold), _turn(text_warm))


async def run_image_chat(
    client: OpenAIClient, *, image_size: int, num_rounds: int, max_tokens: int, seed: int
) -> list[RoundRow]:
    """Warm up (one image chat, one text chat, untimed), then `num_rounds` rounds."""
    check_args(image_size, num_rounds)
    log("image-chat: warm-up (an image never used again, then a short text chat)")
    warmup = image_message(image_size, seed * 1_000 + 999, QUESTION)
    await _chat(client, [warmup], "warm-up image turn", max_tokens, seed)
    opener = {"role": "user", "content": corpus.unique_prefix(999, seed)}
    await _chat(client, [opener], "warm-up text turn", max_tokens, seed)
    return [
        await run_round(client, i, image_size=image_size, max_tokens=max_tokens, seed=seed)
        for i in range(num_rounds)
    ]


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def medians(rows: list[RoundRow]) -> dict[str, float | None]:
    """Median TTFT in ms of each turn kind over the rounds."""
    kinds = ("image_cold", "image_warm", "text_cold", "text_warm")
    return {k: _median([getattr(r, k).ttft_ms for r in rows]) for k in kinds}


def _pair(a: int | None, b: int | None) -> str:
    return f"{fmt(a)}/{fmt(b)}"


def table(rows: list[RoundRow], image_size: int) -> Table:
    """One row per round and a medians row; TTFT in ms, prompt and cached tokens as turn 1/2."""
    body: list[list[Any]] = [
        [
            r.round_idx,
            r.image_cold.ttft_ms,
            r.image_warm.ttft_ms,
            r.text_cold.ttft_ms,
            r.text_warm.ttft_ms,
            r.ratio,
            _pair(r.image_cold.prompt_tokens, r.image_warm.prompt_tokens),
            _pair(r.text_cold.prompt_tokens, r.text_warm.prompt_tokens),
            _pair(r.image_warm.cached_tokens, r.text_warm.cached_tokens),
        ]
        for r in rows
    ]
    med = medians(rows)
    ratio = _ratio(med["image_warm"], med["text_warm"])
    body.append(["median", *med.values(), ratio, "", "", ""])
    return Table(
        f"image chat TTFT ({image_size}x{image_size} image, a fresh one per round)",
        [
            "round",
            "image cold ms",
            "image turn-2 ms",
            "text cold ms",
            "text turn-2 ms",
            "turn-2 image/text",
            "image prompt tok 1/2",
            "text prompt tok 1/2",
            "turn-2 cached tok image/text",
        ],
        body,
        [
            "text turns: random words sized to the image turn's prompt tokens, "
            f"within {TOLERANCE_TOKENS} where the server's counts allow",
            "turn 2 repeats turn 1 (the same image bytes) with its answer and a new question",
        ],
    )


def gate(rows: list[RoundRow]) -> Gate:
    """PASS when the median image second turn is within 10% of the median text second turn."""
    med = medians(rows)
    ratio = _ratio(med["image_warm"], med["text_warm"])
    name = f"second turn within {round((MAX_RATIO - 1) * 100)}% of text-only"
    if ratio is None:
        return Gate(name, False, "no median TTFT to compare")
    detail = (
        f"median image turn 2 {med['image_warm']:.1f} ms vs text turn 2 "
        f"{med['text_warm']:.1f} ms: {ratio:.2f}x (limit {MAX_RATIO:.2f}x)"
    )
    return Gate(name, ratio <= MAX_RATIO, detail)


def plot(rows: list[RoundRow]) -> Plot:
    """TTFT of the four turn kinds per round."""
    return Plot(
        "image-chat.png",
        "Time to first token per turn",
        "round",
        "ms",
        [r.round_idx for r in rows],
        {
            "image cold": [r.image_cold.ttft_ms for r in rows],
            "image turn 2": [r.image_warm.ttft_ms for r in rows],
            "text cold": [r.text_cold.ttft_ms for r in rows],
            "text turn 2": [r.text_warm.ttft_ms for r in rows],
        },
        kind="bar",
    )
