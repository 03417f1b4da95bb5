"""`create_app(config)`, and `serve`: the `sparkinfer-api` command once its port is bound.

Both take the one frozen `ServerConfig` (`settings.server_config`) and hand each runtime object
its branch of it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from sparkinfer.api import tensor_parallel
from sparkinfer.api.anthropic_errors import AnthropicErrorMiddleware
from sparkinfer.api.cli import main as main  # the command, here for `python -c` callers
from sparkinfer.api.cors import cors_options
from sparkinfer.api.dependencies import ServerState, require_api_key
from sparkinfer.api.draft_model import check_draft_model, load_draft_model
from sparkinfer.api.edge import EdgeMiddleware
from sparkinfer.api.engine_client import EngineClient
from sparkinfer.api.errors import install_error_handlers
from sparkinfer.api.grammar import GrammarCompiler
from sparkinfer.api.media import MediaConfig, build_media_config
from sparkinfer.api.metrics import ServerMetrics
from sparkinfer.api.openapi import install_openapi
from sparkinfer.api.request_ids import RequestIdMiddleware
from sparkinfer.api.response_store import ResponseStore
from sparkinfer.api.routers import (
    chat,
    completions,
    health,
    messages,
    models,
    responses,
    score,
    tokenize,
)
from sparkinfer.api.sampling import SamplingDefaults, SamplingRules
from sparkinfer.api.serve import build_server
from sparkinfer.api.server_config import ModelLoading, ServerConfig
from sparkinfer.api.settings import SettingsError, env_name
from sparkinfer.model import embedded
from sparkinfer.model.chat_template import ChatTemplate
from sparkinfer.model.config import GenerationDefaults, ModelConfig
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.errors import CheckpointError, ConfigError
from sparkinfer.model.hub import fetch_checkpoint
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model, quantize_model_fp8, read_checkpoint_configs
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.distributed.launch import TensorParallelRanks
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.errors import CacheAllocationError, InvalidConfig

logger = logging.getLogger("sparkinfer.api")

# What start-up refuses (settings, the checkpoint, the memory): one line, exit status 2.
STARTUP_ERRORS = (SettingsError, InvalidConfig, CacheAllocationError, ConfigError, CheckpointError)

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _device(loading: ModelLoading) -> torch.device:
    if loading.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(loading.device)


def _dtype(loading: ModelLoading, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on a GPU, float32 on the CPU (where bf16 matmuls are slow)."""
    if loading.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[loading.dtype]


def _max_model_len(loading: ModelLoading, config: ModelConfig) -> int:
    limit = config.context_len
    if loading.max_model_len is None:
        return limit
    if loading.max_model_len > limit:
        raise SettingsError(
            f"SPARKINFER_MAX_MODEL_LEN (--max-model-len) is {loading.max_model_len}; the "
            f"checkpoint supports {limit} tokens: lower it or leave it unset"
        )
    return loading.max_model_len


def _media_config(
    config: ServerConfig, model: Qwen3_8ForCausalLM, checkpoint_dir: Path | None
) -> MediaConfig | None:
    """Image and video input, when the model has a vision tower (the config's media branch)."""
    if not model.has_vision:
        return None
    context = _max_model_len(config.model, model.config)
    media = config.media
    if not media.use_mrope:
        logger.warning(
            "--no-mrope: image and video tokens get sequential positions; the model loses their "
            "2-D layout (for debugging or text-only checkpoints)"
        )
    return build_media_config(
        model.config,
        checkpoint_dir,
        limits=media.limits,
        video_fps=media.video.fps,
        video_max_frames=media.video.max_frames,
        use_mrope=media.use_mrope,
        max_parts=media.max_parts,
        max_tokens=min(media.max_tokens, context),
        max_request_pixels=media.max_request_pixels,
        max_request_bytes=media.max_request_bytes,
    )


@dataclass(frozen=True)
class _LoadedModel:
    """What start-up read from the checkpoint, or built for the embedded model."""

    served: str  # the model id the API answers to
    config: ModelConfig
    gen: GenerationDefaults
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    model: Qwen3_8ForCausalLM
    media: MediaConfig | None
    ranks: TensorParallelRanks | None = None  # tensor parallel: `model` is rank 0's shard
    drafter: BlockDrafter | None = None  # --draft-model, loaded and checked; the engine drafts


def build_state(config: ServerConfig) -> ServerState:
    """Load the tokenizer, template and model, and start the engine (minutes for a real model)."""
    source = config.model.model
    device = _device(config.model)
    dtype = _dtype(config.model, device)
    check_draft_model(config)  # config files only: before any weight loads
    if source in (None, embedded.EMBEDDED_MODEL_ID):
        logger.warning(
            "no --model given: serving the embedded %s, a 15M-parameter code model trained for "
            "testing (it writes short Python functions, tool calls and JSON; it is not a general "
            "assistant, and its vision tower has random weights). Serve a real checkpoint with "
            "--model PATH_OR_HUB_ID (e.g. --model Qwen/Qwen3.8-27B).",
            embedded.EMBEDDED_MODEL_ID,
        )
        checkpoint = str(embedded.embedded_checkpoint_dir())
        loaded = _load_checkpoint(config, checkpoint, embedded.EMBEDDED_MODEL_ID, device, dtype)
    elif source == embedded.RANDOM_MODEL_ID:
        loaded = _build_random(config, device, dtype)
    else:
        loaded = _load_checkpoint(config, source, source, device, dtype)
    drafter = load_draft_model(config, loaded.model)
    return _start(config, replace(loaded, drafter=drafter), device)


def _build_random(config: ServerConfig, device: torch.device, dtype: torch.dtype) -> _LoadedModel:
    logger.warning(
        "serving the built-in %s with RANDOM WEIGHTS (its output is noise; it has Qwen's real "
        "vocabulary, for tests that need it)",
        embedded.RANDOM_MODEL_ID,
    )
    tokenizer = Tokenizer.embedded()
    model = embedded.build_random_model(device=device, dtype=dtype)
    if config.model.quantization == "fp8":
        quantize_model_fp8(model)
    return _LoadedModel(
        served=config.model.served_model_name or embedded.RANDOM_MODEL_ID,
        config=model.config,
        gen=embedded.RANDOM_GENERATION_DEFAULTS,
        tokenizer=tokenizer,
        chat_template=ChatTemplate.builtin(tokenizer),
        model=model,
        media=_media_config(config, model, None),
    )


def _load_checkpoint(
    config: ServerConfig, source: str, model_id: str, device: torch.device, dtype: torch.dtype
) -> _LoadedModel:
    progress = sys.stderr.isatty()  # bars in a terminal; in a log, a line before and after
    # A hub id: the weights too.
    configs = read_checkpoint_configs(fetch_checkpoint(source, progress=progress), progress=False)
    tokenizer = Tokenizer.from_checkpoint(configs.path)
    chat_template = ChatTemplate.from_checkpoint(configs.path, tokenizer)
    logger.info("loading %s on %s as %s", source, device, dtype)
    started = time.monotonic()
    ranks = None
    quantization = config.model.quantization
    if config.engine.tensor_parallel_size > 1:  # each rank loads its own slices
        ranks = tensor_parallel.start_ranks(
            config, configs.path, configs.model,
            device=device, dtype=dtype, num_real_tokens=tokenizer.vocab_size,
        )  # fmt: skip
        model = ranks.shard
    else:
        model = load_model(
            configs.path,
            device=device,
            dtype=dtype,
            num_real_tokens=tokenizer.vocab_size,
            use_mtp=_use_mtp(config),
            quantization=None if quantization == "none" else quantization,
            progress=progress,
        )
    logger.info("loaded the weights in %.1f s", time.monotonic() - started)
    return _LoadedModel(
        served=config.model.served_model_name or model_id,
        config=configs.model,
        gen=configs.generation,
        tokenizer=tokenizer,
        chat_template=chat_template,
        model=model,
        media=_media_config(config, model, configs.path),
        ranks=ranks,
    )


def _use_mtp(config: ServerConfig) -> bool | Literal["auto"]:
    """Whether to load the checkpoint's MTP head: not beside a --draft-model, which drafts."""
    speculative = config.engine.speculative
    if speculative == "auto":
        return "auto" if config.model.draft_model is None else False
    return speculative == "mtp"


def _scheduler_config(
    config: ServerConfig, loaded: _LoadedModel, max_model_len: int
) -> SchedulerConfig:
    """The engine's config with what the model settled: its context, and the generation
    config's and the tokenizer's EOS ids (both stop)."""
    eos = (*loaded.gen.eos_token_ids, *loaded.tokenizer.eos_token_ids)
    return replace(
        config.engine, max_model_len=max_model_len, eos_token_ids=tuple(dict.fromkeys(eos))
    )


def _check_device_rules(config: ServerConfig) -> None:
    """The engine's rules for the device it will run on, before anything loads."""
    if _device(config.model).type != "cuda":
        return
    try:
        config.engine.check_cuda()
    except InvalidConfig as exc:
        flag = "--" + exc.setting.replace("_", "-")
        raise SettingsError(
            f"invalid setting {flag} ({env_name(exc.setting)}) on CUDA: {exc}"
        ) from None


def _start(config: ServerConfig, loaded: _LoadedModel, device: torch.device) -> ServerState:
    """Start the engine on the loaded model and gather what the routes share."""
    max_model_len = _max_model_len(config.model, loaded.config)
    sched = _scheduler_config(config, loaded, max_model_len)
    logger.info("starting the engine: sizing the caches and warming up the model on %s", device)
    started = time.monotonic()
    if loaded.ranks is not None:
        engine = loaded.ranks.engine(sched)
    else:
        engine = Engine.from_model(loaded.model, sched, device=device, drafter=loaded.drafter)
    logger.info("engine ready in %.1f s", time.monotonic() - started)
    metrics = ServerMetrics(engine.stats)
    limits = engine.limits
    logger.info("serving %r: max_model_len %d on %s", loaded.served, limits.max_model_len, device)
    gen, vocab_size = loaded.gen, loaded.config.text.vocab_size
    return ServerState(
        config=config,
        model_id=loaded.served,
        max_model_len=limits.max_model_len,
        model_vocab_size=vocab_size,
        has_vision=loaded.media is not None,
        tokenizer=loaded.tokenizer,
        chat_template=loaded.chat_template,
        sampling=SamplingRules(
            SamplingDefaults(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p),
            loaded.tokenizer,
            config.requests.max_logit_bias,
        ),
        engine=EngineClient(engine, metrics),
        metrics=metrics,
        grammars=GrammarCompiler(loaded.tokenizer, model_vocab_size=vocab_size),
        created=int(time.time()),
        media=loaded.media,
    )


def create_app(config: ServerConfig, *, state: ServerState | None = None) -> FastAPI:
    """The FastAPI app; the model loads and the engine starts in its lifespan (or use `state`)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncGenerator[None, None]:
        server = state or build_state(config)
        app.state.server = server
        app.state.responses = ResponseStore(config.store.data_dir, limits=config.store.limits)
        try:
            yield
        finally:
            server.engine.shutdown()
            app.state.responses.close()
            server.grammars.close()

    app = FastAPI(title="SparkInfer", lifespan=lifespan)
    guarded_routers = (
        models.router, chat.router, completions.router, score.router, tokenize.router,
        messages.router, responses.router,
    )  # fmt: skip
    install_error_handlers(app)
    install_openapi(app, guarded_routers)
    app.add_middleware(EdgeMiddleware, config=config.edge)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(AnthropicErrorMiddleware)  # sees the edge's errors too
    if (cors := cors_options(config.cors_allow_origins)) is not None:
        # Outermost: a preflight is answered before the API key or the body is looked at.
        app.add_middleware(CORSMiddleware, **cors)
    app.include_router(health.router)
    for router in guarded_routers:
        app.include_router(router, dependencies=[Depends(require_api_key)])
    return app


def serve(config: ServerConfig, sock: socket.socket) -> None:
    """Check the device rules, load the model, start the engine, then serve on `sock` (bound to
    the config's port). Raises one of STARTUP_ERRORS before the server starts."""
    _check_device_rules(config)
    tensor_parallel.check_config(config, _device(config.model))
    logging.basicConfig(
        level=config.listen.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    state = build_state(config)
    host, port = sock.getsockname()[:2]
    logger.info("listening on http://%s:%d", host, port)
    build_server(create_app(config, state=state), config.listen).run(sockets=[sock])
