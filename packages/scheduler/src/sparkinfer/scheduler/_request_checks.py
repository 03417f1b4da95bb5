"""What a request may be: token ids in the vocabulary, a prompt and max_tokens that fit the context
window and the KV cache (plain Python, no torch)."""

from __future__ import annotations

from collections.abc import Sequence

from sparkinfer.scheduler.errors import ContextLengthExceeded, InvalidRequest, RequestTooLarge
from sparkinfer.scheduler.request import SamplingParams


def request_max_len(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int | None,
    max_model_len: int,
    max_cached_tokens: int,
) -> int:
    """The most tokens (prompt + generated) the request may reach; raises when it cannot run.

    vocab_size None skips the id checks; max_cached_tokens is what the whole KV cache holds (the
    last sampled token never enters it, so a request may reach one token more).
    """
    num_prompt = len(prompt_token_ids)
    if num_prompt == 0:
        raise InvalidRequest("prompt_token_ids is empty: send at least one token")
    _check_token_ids(prompt_token_ids, params, vocab_size)
    if num_prompt >= max_model_len:
        raise ContextLengthExceeded(
            f"prompt has {num_prompt} tokens; max_model_len is {max_model_len}: "
            "shorten the prompt or raise max_model_len"
        )
    if params.max_tokens is not None and num_prompt + params.max_tokens > max_model_len:
        raise ContextLengthExceeded(
            f"prompt has {num_prompt} tokens and max_tokens is {params.max_tokens}, "
            f"{num_prompt + params.max_tokens} in all; max_model_len is {max_model_len}: "
            "lower max_tokens, shorten the prompt or raise max_model_len"
        )
    capacity = max_cached_tokens + 1
    if params.max_tokens is None:
        max_len = min(max_model_len, capacity)
        if num_prompt >= max_len:
            raise RequestTooLarge(
                f"prompt has {num_prompt} tokens; the KV cache holds {max_cached_tokens}: "
                "shorten the prompt, or give the cache more memory"
            )
        return max_len
    max_len = num_prompt + params.max_tokens
    if max_len > capacity:
        raise RequestTooLarge(
            f"prompt ({num_prompt}) plus max_tokens ({params.max_tokens}) needs "
            f"{max_len - 1} tokens of KV cache; it holds {max_cached_tokens}: lower max_tokens, "
            "shorten the prompt, or give the cache more memory"
        )
    return max_len


def _check_token_ids(
    prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int | None
) -> None:
    # The sampler indexes logits rows by stop and bias ids: one out of range would fail the
    # whole step it shares with other requests, and a negative one would silently wrap.
    if vocab_size is None:
        return
    named = {
        "prompt_token_ids": prompt_token_ids,
        "stop_token_ids": params.stop_token_ids,
        "logit_bias": [t for t, _ in params.logit_bias],
    }
    for name, ids in named.items():
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(
                f"{name} holds {bad}; token ids must be in [0, {vocab_size}): "
                "use ids of the served model's tokenizer"
            )
