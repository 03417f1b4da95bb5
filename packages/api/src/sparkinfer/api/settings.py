"""Server settings: flags and `SPARKINFER_*` environment variables, read in this module only.

`load_settings` reads and checks them; `server_config` turns them, once, into the frozen
`ServerConfig` tree the server runs with (`server_config.py`). The engine's settings are
`SchedulerConfig`'s fields: each takes its default and description from there
(`engine_setting`), and its rule is checked by building the config at load time, so a bad value
stops start-up naming the flag or variable, never the first forward.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, cast

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from sparkinfer.api.edge import EdgeConfig
from sparkinfer.api.response_store import StoreLimits
from sparkinfer.api.server_config import (
    ListenConfig,
    MediaSettings,
    ModelLoading,
    RequestLimits,
    ServerConfig,
    StoreConfig,
)
from sparkinfer.multimodal import MediaLimits, VideoSampling
from sparkinfer.multimodal.data_url import HELP as MEDIA_HELP
from sparkinfer.scheduler.config import HELP, SchedulerConfig, SpeculativeMethod
from sparkinfer.scheduler.errors import InvalidConfig

ENV_PREFIX = "SPARKINFER_"
ENV_ONLY = frozenset({"api_key"})  # secrets: no flag, whose value any user could read in ps
_ENGINE_FIELDS = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
# setting -> MediaLimits field: the settings keep their names, MediaLimits owns the values
MEDIA_SETTINGS = {
    "media_max_bytes": "max_bytes",
    "media_max_pixels": "max_image_pixels",
    "video_max_seconds": "max_video_seconds",
    "video_max_source_frames": "max_video_source_frames",
    "video_decode_timeout_s": "max_decode_seconds",
}


def engine_setting(name: str) -> Any:
    """The pydantic field of engine knob `name`: SchedulerConfig's default and description."""
    spec = _ENGINE_FIELDS[name]
    return Field(spec.default, description=spec.metadata[HELP])


def media_setting(owner: type[MediaLimits | VideoSampling], name: str) -> Any:
    """The pydantic field of media setting `name` of `owner` (MediaLimits or VideoSampling):
    its default and description, and their one rule (every value > 0)."""
    spec = next(f for f in dataclasses.fields(owner) if f.name == name)
    return Field(spec.default, gt=0, description=spec.metadata[MEDIA_HELP])


class SettingsError(ValueError):
    """A setting has an invalid value or an unknown name; the message names the variable."""


class Settings(BaseSettings):
    """Everything the server can be configured with; one field per `SPARKINFER_<NAME>` variable."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    model: str | None = Field(
        None,
        description="Checkpoint folder or Hugging Face hub id; unset: the embedded code model "
        "(sparkinfer/qwen3.8-code-tiny); sparkinfer/qwen3.8-embedded-random: the random-weight "
        "model with Qwen's vocabulary",
    )
    host: str = Field("127.0.0.1", description="Address to listen on")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0: any free port)")
    served_model_name: str | None = Field(
        None, description="Model id in the API; unset: the value of model"
    )
    max_model_len: int | None = Field(
        None, description="Context window: prompt plus generated tokens; unset: the checkpoint's"
    )  # the one engine knob whose default is not SchedulerConfig's: it comes from the checkpoint
    max_num_seqs: int = engine_setting("max_num_seqs")
    max_num_batched_tokens: int = engine_setting("max_num_batched_tokens")
    max_queue_depth: int = engine_setting("max_queue_depth")
    gpu_memory_utilization: float = engine_setting("gpu_memory_utilization")
    block_size: int = engine_setting("block_size")
    enforce_eager: bool = engine_setting("enforce_eager")
    prefill_graph_tokens: int = engine_setting("prefill_graph_tokens")
    overlap_steps: bool = engine_setting("overlap_steps")
    dependent_launch: bool = engine_setting("dependent_launch")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weight and activation dtype (auto: the checkpoint's)"
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    api_key: SecretStr | None = Field(
        None,
        description="Bearer token every /v1 route requires; unset: no auth. Environment only "
        "(a flag's value would show in ps): or give api_key_file",
    )
    api_key_file: str | None = Field(
        None, description="File whose content (stripped) is the API key, instead of api_key"
    )
    api_keys_file: str | None = Field(
        None,
        description="File of named API keys, a JSON object {name: key}, beside or instead of "
        "api_key (whose name is 'default'): each key's name owns the /v1/responses responses "
        "stored with it, which only that key can read, continue or delete",
    )
    api_key_all_routes: bool = Field(
        False,
        description="With an API key, /metrics, /docs, /redoc and /openapi.json need it too "
        "(/health never does); off, only /v1 routes need it",
    )
    cors_allow_origins: str = Field(
        "http://localhost:*,http://127.0.0.1:*",
        description="Origins whose browser pages may call the API (CORS), comma-separated: `*` "
        "any origin, `scheme://host:*` any port of that host, empty none; preflights never need "
        "the API key",
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1,
        description="Largest request body in bytes (413 beyond it; checked before the body "
        "is read when Content-Length is given)",
    )
    max_json_values: int = Field(
        1_000_000,
        ge=1,
        description="Most JSON values in a request body, counted from its commas and brackets "
        "before it is parsed (400 beyond it): parsing holds the server's Python lock",
    )
    body_read_timeout_s: float = Field(
        60.0, gt=0.0, description="Seconds a client may take to send a request body (408)"
    )
    deterministic: bool = engine_setting("deterministic")
    prefix_cache_snapshots: int = engine_setting("prefix_cache_snapshots")
    prefix_cache_min_tokens: int = engine_setting("prefix_cache_min_tokens")
    vision_cache_bytes: int = engine_setting("vision_cache_bytes")
    vision_graph_patches: int = engine_setting("vision_graph_patches")
    quantization: Literal["none", "fp8"] = Field(
        "none",
        description="fp8: quantize a bf16 checkpoint's decoder projections to FP8 on load "
        "(e4m3, 128x128 block scales, the modules Qwen's FP8 releases keep in bf16 kept in bf16); "
        "a Qwen FP8 checkpoint runs in FP8 whatever this says",
    )
    speculative: SpeculativeMethod = engine_setting("speculative")
    num_speculative_tokens: int = engine_setting("num_speculative_tokens")
    speculative_draft_vocab: int = engine_setting("speculative_draft_vocab")
    draft_model: str | None = Field(
        None,
        description="Block drafter checkpoint folder or hub id, in the DFlash, DFlash2 or DSpark "
        "layout (e.g. z-lab/Qwen3.6-27B-DFlash, RadixArk/Qwen3.8-27B-DSpark; embedded: the "
        "embedded model's own DFlash drafter, shipped in the package), for the served model: "
        "its config.json is checked against the model's before any weight loads (a "
        "drafter for another model stops start-up naming the field), then it loads beside the "
        "model, sharing its embedding and head; the engine drafts with it under --speculative "
        "auto or draft_model",
    )
    tensor_parallel_size: int = engine_setting("tensor_parallel_size")
    mrope: bool = Field(
        True,
        description="3-axis (t, h, w) rotary positions for image and video tokens (off: "
        "sequential positions, spatial layout lost; for debugging)",
    )
    video_fps: float = media_setting(VideoSampling, "fps")
    video_max_frames: int = media_setting(VideoSampling, "max_frames")
    media_max_bytes: int = media_setting(MediaLimits, "max_bytes")
    media_max_pixels: int = media_setting(MediaLimits, "max_image_pixels")
    max_media_parts: int = Field(
        32, ge=0, description="Most image and video parts in one request (counted before decoding)"
    )
    max_media_tokens: int = Field(
        16384,
        ge=1,
        description="Most vision tokens of one request's images and videos in all (decoding "
        "stops once they pass it), at most max_model_len",
    )
    media_max_request_pixels: int = Field(
        33_554_432,
        ge=1,
        description="Most image pixels of one request in all, read from the images' headers "
        "before any is decoded",
    )
    media_max_request_bytes: int = Field(
        33_554_432,
        ge=1,
        description="Most decoded data: URL bytes of one request's images and videos in all, "
        "counted before any is decoded",
    )
    video_max_seconds: float = media_setting(MediaLimits, "max_video_seconds")
    video_max_source_frames: int = media_setting(MediaLimits, "max_video_source_frames")
    video_decode_timeout_s: float = media_setting(MediaLimits, "max_decode_seconds")
    max_logit_bias: int = Field(
        300, ge=0, description="Most logit_bias entries in one request (OpenAI's limit)"
    )
    max_schema_nodes: int = Field(
        4000,
        ge=1,
        description="Most JSON values in one request's tool parameter schemas (in all) or "
        "response_format schema enforced as a grammar (bounds the grammar's compile time)",
    )
    max_schema_bytes: int = Field(
        262144,
        ge=1,
        description="Most bytes (as JSON) of one request's tool parameter schemas (in all) or "
        "response_format schema enforced as a grammar; enums hold at most 1000 values in all "
        "(OpenAI's limit)",
    )
    grammar_compile_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="Seconds a grammar from a request's schema may take to compile, waiting "
        "for a free compile slot included, before a 400 (the compile is stopped: each runs in "
        "a process of its own, at most 4 at once and 2 per client)",
    )
    data_dir: str | None = Field(
        None,
        description="Folder for server data: stored /v1/responses responses "
        "(responses.sqlite3); unset: kept in memory and lost at exit",
    )
    max_stored_responses: int = Field(
        1000,
        ge=0,
        description="Most stored /v1/responses responses kept (the oldest are dropped first; "
        "0: none are stored)",
    )
    max_stored_response_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Largest stored /v1/responses response in bytes, with the input items it "
        "adds (a bigger request with store true is refused before it runs)",
    )
    max_stored_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="Most bytes of stored /v1/responses responses in all (the oldest are "
        "dropped first); at least max_stored_response_bytes",
    )
    request_timeout_s: float = Field(
        3600.0,
        ge=0.0,
        description="Seconds one request may run in all before it is ended (504, or an error "
        "event in a stream) and its generation aborted; 0: no deadline",
    )
    header_read_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="Seconds a connection may take to send a request's headers (from its "
        "opening or its previous response) before it is closed",
    )
    shutdown_drain_s: float = Field(
        30.0,
        ge=0.0,
        description="Seconds SIGTERM lets open requests finish; then the rest end with an error "
        "(streams: an error event) and the server exits 0",
    )
    keep_alive_s: float = Field(
        15.0, gt=0.0, description="Seconds without tokens before an SSE `: keep-alive` comment"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Server log level"
    )


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _check_unknown(environ: Mapping[str, str]) -> None:
    known = {env_name(f) for f in Settings.model_fields}
    unknown = sorted(
        k for k in environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in known
    )
    if unknown:
        raise SettingsError(
            f"unknown setting {unknown[0]}: known settings are {', '.join(sorted(known))}; "
            "fix the name or unset it"
        )


def _where(field: str, overrides: Mapping[str, object]) -> str:
    """The flag when the value came from one, else the variable."""
    return f"--{field.replace('_', '-')}" if field in overrides else env_name(field)


def _describe(err: ValidationError, overrides: Mapping[str, object]) -> str:
    first = err.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else "?"
    return f"invalid setting {_where(field, overrides)}={first.get('input')!r}: {first['msg']}"


def load_settings(
    overrides: Mapping[str, object] | None = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build `Settings` from flags (overrides) over `SPARKINFER_*` variables over defaults.

    Raises `SettingsError` naming the variable or flag for an unknown name or an invalid value.
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_unknown(os.environ if environ is None else environ)
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        raise SettingsError(_describe(err, overrides)) from None
    try:
        scheduler_config(settings)  # the engine's rules, checked before anything loads
    except InvalidConfig as err:
        raise SettingsError(f"invalid setting {_where(err.setting, overrides)}: {err}") from None
    if settings.max_stored_bytes < settings.max_stored_response_bytes:
        raise SettingsError(
            f"max_stored_bytes ({settings.max_stored_bytes}) is below max_stored_response_bytes "
            f"({settings.max_stored_response_bytes}): raise it or lower the other"
        )
    settings = _with_key_file(settings)
    api_keys(settings)  # a bad keys file stops start-up
    return settings


def scheduler_config(
    settings: Settings, *, max_model_len: int | None = None, eos_token_ids: tuple[int, ...] = ()
) -> SchedulerConfig:
    """Settings -> SchedulerConfig: every engine knob the settings share with it, plus what
    start-up reads from the checkpoint (`max_model_len` beats the setting; without either, the
    config's default stands in while only the rules are checked)."""
    knobs = {
        name: getattr(settings, name) for name in _ENGINE_FIELDS if name in Settings.model_fields
    }
    if max_model_len is not None:
        knobs["max_model_len"] = max_model_len
    elif settings.max_model_len is None:
        del knobs["max_model_len"]
    knobs["eos_token_ids"] = eos_token_ids
    return dataclasses.replace(SchedulerConfig(), **knobs)


def media_limits(settings: Settings) -> MediaLimits:
    """Settings -> MediaLimits: the media limits the settings share with it."""
    return MediaLimits(**{field: getattr(settings, name) for name, field in MEDIA_SETTINGS.items()})


def server_config(settings: Settings) -> ServerConfig:
    """Settings -> the one frozen `ServerConfig` tree (built once, at start-up)."""
    s = settings
    model = ModelLoading(
        s.model, s.served_model_name, s.max_model_len, s.dtype, s.device, s.quantization,
        s.draft_model,
    )  # fmt: skip
    requests = RequestLimits(
        s.max_logit_bias, s.max_schema_nodes, s.max_schema_bytes, s.grammar_compile_timeout_s,
        s.keep_alive_s,
    )  # fmt: skip
    media = MediaSettings(
        limits=media_limits(s),
        video=VideoSampling(fps=s.video_fps, max_frames=s.video_max_frames),
        use_mrope=s.mrope,
        max_parts=s.max_media_parts,
        max_tokens=s.max_media_tokens,
        max_request_pixels=s.media_max_request_pixels,
        max_request_bytes=s.media_max_request_bytes,
    )
    store_limits = StoreLimits(
        s.max_stored_responses, s.max_stored_response_bytes, s.max_stored_bytes
    )
    store = StoreConfig(None if s.data_dir is None else Path(s.data_dir), store_limits)
    listen = ListenConfig(s.host, s.port, s.header_read_timeout_s, s.shutdown_drain_s, s.log_level)
    return ServerConfig(
        model=model,
        engine=scheduler_config(s),
        edge=edge_config(s),
        cors_allow_origins=s.cors_allow_origins,
        requests=requests,
        media=media,
        store=store,
        listen=listen,
    )


def edge_config(settings: Settings) -> EdgeConfig:
    """The edge's limits from the settings; /health never needs the key."""
    is_all_routes = settings.api_key_all_routes

    def is_guarded(path: str) -> bool:
        if path.startswith("/v1/") or path == "/v1":
            return True
        return is_all_routes and path != "/health"

    return EdgeConfig(
        api_keys=api_keys(settings),
        is_guarded=is_guarded,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_read_timeout_s,
        request_timeout_s=settings.request_timeout_s or None,
        max_json_values=settings.max_json_values,
    )


def _with_key_file(settings: Settings) -> Settings:
    """`settings` with api_key read from api_key_file, when that is given."""
    path = settings.api_key_file
    if path is None:
        return settings
    if settings.api_key is not None:
        raise SettingsError(
            f"both {env_name('api_key')} and api_key_file are set: give the key one way"
        )
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SettingsError(f"api_key_file {path!r} cannot be read ({exc.strerror})") from None
    if not key:
        raise SettingsError(f"api_key_file {path!r} is empty: write the key into it")
    return settings.model_copy(update={"api_key": SecretStr(key)})


DEFAULT_KEY_NAME = "default"  # the name of api_key among the named keys


def api_keys(settings: Settings) -> dict[str, str]:
    """Every API key the server takes, by name: api_key as 'default', then api_keys_file's."""
    keys: dict[str, str] = {}
    if settings.api_key is not None:
        keys[DEFAULT_KEY_NAME] = settings.api_key.get_secret_value()
    path = settings.api_keys_file
    if path is None:
        return keys
    where = f"api_keys_file {path!r}"
    try:
        named = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"{where} cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise SettingsError(f"{where} is not JSON ({exc}): write {{name: key}}") from None
    if not isinstance(named, dict) or not named:
        raise SettingsError(f"{where} must be a JSON object {{name: key}} with at least one key")
    for name, key in cast("dict[Any, Any]", named).items():
        if not isinstance(key, str) or not key.strip() or not name:
            raise SettingsError(f"{where}: key {name!r} must be a non-empty string")
        if name in keys or key.strip() in keys.values():
            raise SettingsError(
                f"{where}: name {name!r} or its key is given twice: make both unique"
            )
        keys[str(name)] = key.strip()
    return keys


def _shown(default: object) -> str:
    """A default as its flag or variable would spell it."""
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


class _OneLineErrorParser(argparse.ArgumentParser):
    """An unknown or incomplete flag is one line on stderr (exit 2), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}: `{self.prog} --help` lists the flags\n")


def build_parser() -> argparse.ArgumentParser:
    """One `--flag` per setting; an omitted flag falls back to its variable, then the default."""
    parser = _OneLineErrorParser(
        prog="sparkinfer-api",
        description="SparkInfer OpenAI-compatible server. Every flag is also a SPARKINFER_* "
        "environment variable (e.g. --max-model-len = SPARKINFER_MAX_MODEL_LEN); the API key "
        "is a variable only.",
    )
    for name, info in Settings.model_fields.items():
        if name in ENV_ONLY:
            continue
        flag = "--" + name.replace("_", "-")
        default = "" if info.default is None else f"default {_shown(info.default)}; "
        # argparse expands %-formats in help: a literal percent sign must be doubled.
        help_text = f"{info.description} [{default}{env_name(name)}]".replace("%", "%%")
        if info.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, default=None, help=help_text, metavar=name.upper())
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    """Parse command-line flags into `Settings` (raises `SettingsError` on bad values)."""
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    return load_settings(overrides), args
