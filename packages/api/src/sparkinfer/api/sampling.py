"""Request fields → the engine's `SamplingParams`, with checkpoint defaults and edge checks."""

from __future__ import annotations

from sparkinfer.api.dependencies import ServerState
from sparkinfer.api.errors import ContextLengthError, InvalidRequest
from sparkinfer.api.schemas.common import SamplingFields
from sparkinfer.scheduler.request import SamplingParams


def check_context(
    num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, *, prompt_param: str
) -> None:
    """400 context_length_exceeded when the prompt (plus max_tokens) does not fit."""
    if num_prompt_tokens >= max_model_len:
        raise ContextLengthError(
            f"{prompt_param} has {num_prompt_tokens} tokens; max_model_len is {max_model_len} "
            "(room is needed for at least one new token): shorten the prompt",
            param=prompt_param,
        )
    if max_tokens is not None and num_prompt_tokens + max_tokens > max_model_len:
        raise ContextLengthError(
            f"{prompt_param} has {num_prompt_tokens} tokens and max_tokens is {max_tokens}, "
            f"{num_prompt_tokens + max_tokens} in all; max_model_len is {max_model_len}: lower "
            "max_tokens (or leave it out to generate up to the limit) or shorten the prompt",
            param="max_tokens",
        )


def check_prompt_ids(ids: list[int], param: str, vocab_size: int) -> list[int]:
    """`ids` unchanged; 400 naming `param` when they are empty or hold an id outside the vocab."""
    if not ids:
        raise InvalidRequest(f"{param} encodes to no tokens: send some text", param=param)
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequest(
            f"{param} holds token id {bad[0]}; ids are in [0, {vocab_size}): fix the prompt",
            param=param,
        )
    return ids


def _logit_bias(req: SamplingFields, vocab_size: int) -> tuple[tuple[int, float], ...]:
    out: list[tuple[int, float]] = []
    for key, bias in (req.logit_bias or {}).items():
        token_id = int(key)
        if token_id >= vocab_size:
            raise InvalidRequest(
                f"logit_bias names token {token_id}; token ids are below {vocab_size}",
                param="logit_bias",
            )
        out.append((token_id, float(bias)))
    return tuple(out)


def build_params(
    req: SamplingFields,
    state: ServerState,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    choice_idx: int = 0,
) -> SamplingParams:
    """The engine parameters of one choice (seeded choices get seed + index, so they differ)."""
    d = state.defaults
    top_k = d.top_k if req.top_k is None else req.top_k
    stop_ids = tuple(req.stop_token_ids or ())
    bad = [t for t in stop_ids if not 0 <= t < state.model_vocab_size]
    if bad:
        raise InvalidRequest(
            f"stop_token_ids holds {bad[0]}; token ids are in [0, {state.model_vocab_size})",
            param="stop_token_ids",
        )
    seed = None if req.seed is None else (req.seed + choice_idx) % 2**63
    return SamplingParams(
        temperature=d.temperature if req.temperature is None else req.temperature,
        top_p=d.top_p if req.top_p is None else req.top_p,
        top_k=max(top_k, 0),
        min_p=req.min_p or 0.0,
        seed=seed,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop_token_ids=stop_ids,
        ignore_eos=req.ignore_eos,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=_logit_bias(req, state.model_vocab_size),
        logprobs=logprobs,
    )
