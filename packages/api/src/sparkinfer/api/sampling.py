"""Request fields → the engine's `SamplingParams`, with checkpoint defaults and edge checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparkinfer.api.errors import ContextLengthError, InvalidRequest
from sparkinfer.api.schemas.common import SamplingFields
from sparkinfer.model.bounded_encode import TokenBudgetExceeded
from sparkinfer.model.tokenizer import Tokenizer, TokenizerError
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


def encode_prompt(
    tokenizer: Tokenizer, text: str, max_model_len: int, *, param: str, allow_special: bool = True
) -> list[int]:
    """A prompt's ids; 400 context_length_exceeded as soon as the count passes the context
    (encoding stops there: a 30 MB prompt costs what max_model_len tokens cost)."""
    try:
        return tokenizer.encode(text, allow_special=allow_special, max_tokens=max_model_len - 1)
    except TokenBudgetExceeded:
        raise prompt_too_long(param, max_model_len) from None


def prompt_too_long(param: str, max_model_len: int) -> ContextLengthError:
    """The prompt has more tokens than the context holds (counted until it passed it)."""
    return ContextLengthError(
        f"{param} has more than {max_model_len - 1} tokens; max_model_len is {max_model_len} "
        "(room is needed for at least one new token): shorten the prompt",
        param=param,
    )


def check_token_ids(ids: Sequence[int], param: str, tokenizer: Tokenizer) -> None:
    """The one token-id rule: every id is one the tokenizer has a token for. The model's padding
    ids beyond the tokenizer (e.g. 248,077-248,319) have no text: 400 naming `param`."""
    for token_id in ids:
        if 0 <= token_id < tokenizer.vocab_size:
            try:
                tokenizer.token_bytes(token_id)
                continue
            except TokenizerError:  # a gap in the id space
                pass
        raise InvalidRequest(
            f"{param} holds token id {token_id}, which the served model's tokenizer has no "
            f"token for (its ids are in [0, {tokenizer.vocab_size})): use ids from /v1/tokenize",
            param=param,
        )


def check_prompt_ids(ids: list[int], param: str, tokenizer: Tokenizer) -> list[int]:
    """`ids` unchanged; 400 naming `param` when they are empty or break the token-id rule."""
    if not ids:
        raise InvalidRequest(f"{param} encodes to no tokens: send some text", param=param)
    check_token_ids(ids, param, tokenizer)
    return ids


@dataclass(frozen=True)
class Sampling:
    """A request's sampling and stopping fields, read once at the edge from any protocol's
    body (chat, completions, and the conversations Messages and Responses become); None: the
    checkpoint's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    min_tokens: int = 0
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[str, float], ...] = ()  # (token id as the client wrote it, bias)

    @classmethod
    def of(cls, fields: SamplingFields) -> Sampling:
        return cls(
            temperature=fields.temperature,
            top_p=fields.top_p,
            top_k=fields.top_k,
            min_p=fields.min_p,
            seed=fields.seed,
            min_tokens=fields.min_tokens,
            stop_strings=tuple(fields.stop_strings),
            stop_token_ids=tuple(fields.stop_token_ids or ()),
            ignore_eos=fields.ignore_eos,
            presence_penalty=fields.presence_penalty,
            frequency_penalty=fields.frequency_penalty,
            repetition_penalty=fields.repetition_penalty,
            logit_bias=tuple((fields.logit_bias or {}).items()),
        )


@dataclass(frozen=True)
class SamplingDefaults:
    """The checkpoint's generation_config sampling values, used when a request leaves them out."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


@dataclass(frozen=True)
class SamplingRules:
    """What the server adds to a request's `Sampling` (built once at start-up): the
    checkpoint's defaults, the token ids there are, and the cap on logit_bias."""

    defaults: SamplingDefaults
    tokenizer: Tokenizer
    max_logit_bias: int


def _logit_bias(sampling: Sampling, rules: SamplingRules) -> tuple[tuple[int, float], ...]:
    bias = sampling.logit_bias
    limit = rules.max_logit_bias
    if len(bias) > limit:
        raise InvalidRequest(
            f"logit_bias has {len(bias)} entries; at most {limit} are allowed: bias fewer tokens",
            param="logit_bias",
        )
    ids = [int(key) for key, _ in bias]
    check_token_ids(ids, "logit_bias", rules.tokenizer)
    return tuple((t, float(b)) for t, (_, b) in zip(ids, bias, strict=True))


def build_params(
    sampling: Sampling,
    rules: SamplingRules,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    choice_idx: int = 0,
) -> SamplingParams:
    """The engine parameters of one choice (seeded choices get seed + index, so they differ)."""
    d, req = rules.defaults, sampling
    top_k = d.top_k if req.top_k is None else req.top_k
    check_token_ids(req.stop_token_ids, "stop_token_ids", rules.tokenizer)
    seed = None if req.seed is None else (req.seed + choice_idx) % 2**63
    return SamplingParams(
        temperature=d.temperature if req.temperature is None else req.temperature,
        top_p=d.top_p if req.top_p is None else req.top_p,
        top_k=max(top_k, 0),
        min_p=req.min_p or 0.0,
        seed=seed,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=_logit_bias(req, rules),
        logprobs=logprobs,
    )
