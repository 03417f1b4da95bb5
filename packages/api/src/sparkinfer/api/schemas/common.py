"""Body parts shared by several endpoints: sampling fields, usage, stream options, logprobs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20
MAX_N = 16
# The largest count or size any field takes: every value fits the int32 and int64 tensors and
# grammar limits downstream, so one request's number can never fail an engine step.
MAX_COUNT = 2**31 - 1


class RequestBody(BaseModel):
    """Base of request bodies: unknown OpenAI fields are ignored, known ones are checked."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class StreamOptions(RequestBody):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(RequestBody):
    """Sampling and stopping fields common to chat and text completions."""

    model: str | None = Field(
        None, min_length=1, description="served model id; omitted: the one model this server serves"
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=MAX_COUNT)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_COUNT)
    min_tokens: int = Field(0, ge=0, le=MAX_COUNT)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str] | None:
        stops = [v] if isinstance(v, str) else v
        if stops is None:
            return None
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _check_stream_options(
        cls, v: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        """Only a stream has stream options (OpenAI and vLLM refuse them otherwise)."""
        if v is not None and not info.data.get("stream", False):
            raise ValueError("is only allowed with stream true: leave it out or set stream")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"key {key!r} is not a token id; keys are token ids as strings")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"bias {bias} for token {key} is outside [-100, 100]")
        return v

    @property
    def stop_strings(self) -> list[str]:
        stop = self.stop
        return [stop] if isinstance(stop, str) else list(stop or [])


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


def _is_none(value: object) -> bool:
    return value is None


def omitted_if_none() -> Any:
    """A field that defaults to None and is left out of the JSON while None (OpenAI's stream
    chunks omit absent fields rather than send nulls)."""
    return Field(None, exclude_if=_is_none)


class Usage(BaseModel):
    """Token counts, as billed: only the standard keys (telemetry is in `Timings`)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: dict[str, int] | None = omitted_if_none()


class Timings(BaseModel):
    """Engine telemetry of a response (a field of its own, beside `usage`): that of its slowest
    choice, so ttft_ms + generation_ms spans the whole response."""

    ttft_ms: float | None = None
    generation_ms: float | None = None
    decode_tps: float | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob] = Field(default_factory=list[TopLogprob])


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobEntry] | None = None
    refusal: list[TokenLogprobEntry] | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


FinishReasonName = Literal["stop", "length", "tool_calls", "abort", "error"]
JsonObject = dict[str, Any]
