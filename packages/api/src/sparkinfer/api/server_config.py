"""The server's one frozen configuration tree, built once from the settings and handed down whole.

`settings.server_config` builds it; each runtime object takes its own branch (the edge its
`EdgeConfig`, the engine its `SchedulerConfig`, the store its `StoreConfig`, the routes the
`RequestLimits`, the media loader the `MediaSettings`, uvicorn the `ListenConfig`), never loose
settings. Every value is declared once: in `Settings` (the flag and variable), or, for the
engine and the media limits, in the library config it is taken from (`engine_setting`,
`media_setting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sparkinfer.api.edge import EdgeConfig
from sparkinfer.api.response_store import StoreLimits
from sparkinfer.multimodal import MediaLimits, VideoSampling
from sparkinfer.scheduler.config import SchedulerConfig

LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class ModelLoading:
    """Which checkpoint to serve, under which name, and how its weights load."""

    model: str | None  # a folder or hub id; None: the embedded code model
    served_model_name: str | None  # None: the model's own id
    max_model_len: int | None  # the setting; None: the checkpoint's context
    dtype: Literal["auto", "bfloat16", "float16", "float32"]
    device: str  # auto, cpu, cuda or cuda:N
    quantization: Literal["none", "fp8"]
    draft_model: str | None  # a block drafter beside the model; None: none


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the server, checked before it is queued, and how its
    stream is kept alive."""

    max_logit_bias: int
    max_schema_nodes: int
    max_schema_bytes: int
    grammar_compile_timeout_s: float
    keep_alive_s: float


@dataclass(frozen=True)
class MediaSettings:
    """Image and video input: the decode limits, the video frame budget and the per-request
    caps (used only with a vision tower)."""

    limits: MediaLimits
    video: VideoSampling
    use_mrope: bool
    max_parts: int
    max_tokens: int  # at most max_model_len, applied once the context is known
    max_request_pixels: int
    max_request_bytes: int


@dataclass(frozen=True)
class StoreConfig:
    """Where stored /v1/responses responses live (None: in memory) and their budgets."""

    data_dir: Path | None
    limits: StoreLimits


@dataclass(frozen=True)
class ListenConfig:
    """The socket, the header deadline, the shutdown drain and the log level."""

    host: str
    port: int
    header_read_timeout_s: float
    shutdown_drain_s: float
    log_level: LogLevel


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server runs with, one branch per runtime object."""

    model: ModelLoading
    engine: SchedulerConfig  # max_model_len and the EOS ids are settled once the model loads
    edge: EdgeConfig
    cors_allow_origins: str
    requests: RequestLimits
    media: MediaSettings
    store: StoreConfig
    listen: ListenConfig
