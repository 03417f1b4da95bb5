"""Server settings: flags and `SPARKINFER_*` environment variables, read in this module only."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "SPARKINFER_"
ENV_ONLY = frozenset({"api_key"})  # secrets: no flag, whose value any user could read in ps


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
        None, ge=1, description="Context length; unset: the checkpoint's maximum"
    )
    max_num_seqs: int = Field(64, ge=1, description="Most sequences in one engine step")
    max_num_batched_tokens: int = Field(
        2048, ge=1, description="Most tokens in one engine step (prefill chunk budget)"
    )
    max_queue_depth: int = Field(
        0, ge=0, description="Most waiting requests before 429 overloaded (0: unlimited)"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Share of device memory for weights and caches"
    )
    block_size: int = Field(64, ge=1, description="Tokens per KV-cache block")
    enforce_eager: bool = Field(False, description="Never capture CUDA graphs")
    prefill_graph_tokens: int = Field(
        512,
        ge=0,
        description="Largest forward of an engine step's prompt chunks (tokens) "
        "replayed from a CUDA graph: a short prompt's first token came 3.7x sooner at 16 "
        "tokens and 2.4x at 256 on an H200, where launching the step took the host longer "
        "than the device took to run it. 0: such steps launch eagerly",
    )
    overlap_steps: bool = Field(
        True,
        description="Schedule the next engine step while the device runs this one (samples "
        "are read a step later; tokens are the same either way)",
    )
    dependent_launch: bool = Field(
        True,
        description="Launch each Triton kernel while the one before it finishes (programmatic "
        "dependent launch, Hopper and later; outputs are the same either way)",
    )
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
    api_key_all_routes: bool = Field(
        False,
        description="With an API key, /metrics, /docs, /redoc and /openapi.json need it too "
        "(/health never does); off, only /v1 routes need it",
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1,
        description="Largest request body in bytes (413 beyond it; checked before the body "
        "is read when Content-Length is given)",
    )
    body_read_timeout_s: float = Field(
        60.0, gt=0.0, description="Seconds a client may take to send a request body (408)"
    )
    deterministic: bool = Field(
        False,
        description="Batch-invariant numerics: a request's output (greedy, or seeded) does not "
        "depend on what else is batched with it. Costs speed on CUDA (fixed-tile GEMMs: about "
        "16% of prefill and 8-29% of decode at 32-64 streams on an H200, docs/benchmarks.md); "
        "off, output is still identical across runs of the same batch",
    )
    prefix_cache_snapshots: int = Field(
        8,
        ge=0,
        description="Prompt prefixes kept for reuse, each with one snapshot of the model's "
        "recurrent state (147 MiB at 27B, taken from the KV cache's memory); a later prompt "
        "that starts with one prefills only the rest (32,000 of 32,054 tokens cached: 106-108x "
        "faster to the first token on an H200). A new prompt pays one more prefill step to its "
        "checkpoint (+16 ms, 4.7%, at 4K tokens). 0: no prefix cache",
    )
    prefix_cache_min_tokens: int = Field(
        1024,
        ge=1,
        description="Shortest uncached prompt part worth a prefix snapshot: such a prompt ends a "
        "prefill step at its last 128-token checkpoint, where its prefix is kept",
    )
    quantization: Literal["none", "fp8"] = Field(
        "none",
        description="fp8: quantize a bf16 checkpoint's decoder projections to FP8 on load "
        "(e4m3, 128x128 block scales, the modules Qwen's FP8 releases keep in bf16 kept in bf16); "
        "a Qwen FP8 checkpoint runs in FP8 whatever this says",
    )
    speculative: Literal["off", "ngram", "mtp"] = Field(
        "off",
        description="Speculative decoding's drafter: ngram (drafts copied from the request's "
        "own prompt and output: no weights, strong on code, JSON and edits) or mtp (the "
        "checkpoint's MTP head, loaded from its mtp.* tensors). Greedy and seeded output are "
        "unchanged (bit for bit with --deterministic); requests with penalties or a grammar "
        "decode without drafts. Off by default: steps that draft are read at once (no host and "
        "device overlap) and the gain depends on acceptance: measure it on your GPU first "
        "(sparkinfer-bench spec)",
    )
    num_speculative_tokens: int = Field(
        3, ge=1, le=16, description="Most drafts a request verifies per engine step"
    )
    mrope: bool = Field(
        True,
        description="3-axis (t, h, w) rotary positions for image and video tokens (off: "
        "sequential positions, spatial layout lost; for debugging)",
    )
    video_fps: float = Field(2.0, gt=0.0, description="Frames sampled per second of video")
    video_max_frames: int = Field(
        32, ge=1, description="Most frames sampled from one video (longer clips: sparser)"
    )
    media_max_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="Largest decoded data: URL payload of one media part"
    )
    media_max_pixels: int = Field(
        50_000_000, ge=1, description="Largest width x height of an image or video frame"
    )
    max_media_parts: int = Field(
        32, ge=0, description="Most image and video parts in one request (counted before decoding)"
    )
    max_media_tokens: int | None = Field(
        None,
        ge=1,
        description="Most vision tokens of one request's images and videos in all (decoding "
        "stops once they pass it); unset: max_model_len",
    )
    video_max_seconds: float = Field(600.0, gt=0.0, description="Longest video in seconds")
    video_max_source_frames: int = Field(
        36_000, ge=1, description="Most frames in one video stream (bounds decode work)"
    )
    video_decode_timeout_s: float = Field(
        30.0, gt=0.0, description="Seconds one video may take to decode before it is refused"
    )
    max_logit_bias: int = Field(
        300, ge=0, description="Most logit_bias entries in one request (OpenAI's limit)"
    )
    max_schema_nodes: int = Field(
        4000,
        ge=1,
        description="Most JSON values in one request's tool parameter schemas (in all) or "
        "response_format schema enforced as a grammar (1000 integer properties compile in "
        "about 2.4 s on one CPU core)",
    )
    grammar_compile_timeout_s: float = Field(
        10.0,
        gt=0.0,
        description="Seconds a request waits for its grammar to compile before a 400 (the "
        "compile finishes and is cached for the next request)",
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


def _describe(err: ValidationError, overrides: Mapping[str, object]) -> str:
    first = err.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else "?"
    where = f"--{field.replace('_', '-')}" if field in overrides else env_name(field)
    return f"invalid setting {where}={first.get('input')!r}: {first['msg']}"


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
    return _with_key_file(settings)


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


def build_parser() -> argparse.ArgumentParser:
    """One `--flag` per setting; an omitted flag falls back to its variable, then the default."""
    parser = argparse.ArgumentParser(
        prog="sparkinfer-api",
        description="SparkInfer OpenAI-compatible server. Every flag is also a SPARKINFER_* "
        "environment variable (e.g. --max-model-len = SPARKINFER_MAX_MODEL_LEN).",
    )
    for name, info in Settings.model_fields.items():
        if name in ENV_ONLY:
            continue
        flag = "--" + name.replace("_", "-")
        # argparse expands %-formats in help: a literal percent sign must be doubled.
        help_text = f"{info.description} [{env_name(name)}]".replace("%", "%%")
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
