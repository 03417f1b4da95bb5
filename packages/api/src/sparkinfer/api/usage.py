"""A response's `usage` (billing counts over its choices) and `timings` (engine telemetry)."""

from __future__ import annotations

from collections.abc import Sequence

from sparkinfer.api.generation import ChoiceResult
from sparkinfer.api.schemas.common import PromptTokensDetails, Timings, Usage


def _end_ms(result: ChoiceResult) -> float:
    """When a choice finished, in ms after its arrival (choices of a response arrive together)."""
    return (result.metrics.ttft_ms or 0.0) + (result.metrics.generation_ms or 0.0)


def make_usage(
    results: Sequence[ChoiceResult],
    prompt_lens: Sequence[int],
    *,
    reasoning_tokens: int | None = None,
) -> Usage:
    """Usage of `results`, ordered prompt by prompt with the same number of choices each.

    Each prompt counts once however many choices it has (as OpenAI bills n > 1), with the fewest
    cached tokens any of its choices had; completion tokens add up over every choice.
    `reasoning_tokens` (those of the choices' reasoning blocks, in all) goes to
    completion_tokens_details.
    """
    n = len(results) // max(1, len(prompt_lens))
    groups = [results[p * n : (p + 1) * n] for p in range(len(prompt_lens))]
    cached = sum(min((r.num_cached_tokens for r in g), default=0) for g in groups)
    num_prompt = sum(prompt_lens)
    completion = sum(r.num_output_tokens for r in results)
    return Usage(
        prompt_tokens=num_prompt,
        completion_tokens=completion,
        total_tokens=num_prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        completion_tokens_details=(
            None if reasoning_tokens is None else {"reasoning_tokens": reasoning_tokens}
        ),
    )


def make_timings(results: Sequence[ChoiceResult]) -> Timings | None:
    """Telemetry of the slowest choice, the one that finished last (so ttft_ms + generation_ms
    spans the whole response); None without choices."""
    if not results:
        return None
    slowest = max(results, key=_end_ms).metrics
    return Timings(
        ttft_ms=slowest.ttft_ms, generation_ms=slowest.generation_ms, decode_tps=slowest.decode_tps
    )
