"""Typed errors of the engine: bad input subclasses ValueError, exhausted resources RuntimeError."""

from __future__ import annotations


class ContextLengthExceeded(ValueError):
    """The prompt (plus max_tokens) does not fit the context window."""


class RequestTooLarge(ContextLengthExceeded):
    """The request could not fit in the KV cache even if it ran alone."""


class InvalidRequest(ValueError):
    """A request the engine cannot run: empty prompt, unknown token id, duplicate id."""


class QueueFull(RuntimeError):
    """Too many requests already wait; retry after `retry_after_s` seconds."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineStopped(RuntimeError):
    """The engine was shut down, or its loop died; it accepts no more requests."""


class CacheAllocationError(RuntimeError):
    """Not enough memory for even one sequence's KV blocks and state slot."""


class GraphCaptureError(RuntimeError):
    """The decode forward could not be captured as a CUDA graph."""


class InvalidConfig(ValueError):
    """A `SchedulerConfig` field has a value its rule refuses; `setting` names the field."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting
