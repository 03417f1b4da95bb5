"""What every route needs: the server state (model, tokenizer, engine) and the API key."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sparkinfer.api.edge import OWNER_STATE
from sparkinfer.api.engine_client import EngineClient
from sparkinfer.api.errors import ModelNotFound, Unauthorized
from sparkinfer.api.grammar import GrammarCompiler
from sparkinfer.api.media import MediaConfig
from sparkinfer.api.metrics import ServerMetrics
from sparkinfer.api.sampling import SamplingRules
from sparkinfer.api.server_config import ServerConfig
from sparkinfer.model.chat_template import ChatTemplate
from sparkinfer.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class ServerState:
    """Everything built at start-up and shared, read-only, by the routes.

    has_vision is True exactly when `media` is set.
    """

    config: ServerConfig  # the one frozen tree the server was started with
    model_id: str
    max_model_len: int
    model_vocab_size: int
    has_vision: bool
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    sampling: SamplingRules  # the checkpoint's sampling defaults, the vocabulary, the caps
    engine: EngineClient
    metrics: ServerMetrics
    grammars: GrammarCompiler
    created: int
    media: MediaConfig | None = None  # image and video input (None: no vision tower)

    def check_model(self, model: str | None) -> None:
        """404 for a model id this server does not serve (None: the default)."""
        if model is not None and model != self.model_id:
            raise ModelNotFound(
                f"model {model!r} does not exist; this server serves {self.model_id!r}: "
                "use that id (see GET /v1/models)",
                param="model",
            )


def get_state(request: Request) -> ServerState:
    return request.app.state.server


State = Annotated[ServerState, Depends(get_state)]


def now() -> int:
    return int(time.time())


async def require_api_key(request: Request) -> None:
    """With `api_key` set, every /v1 route needs `Authorization: Bearer <key>` (or, as Anthropic
    clients send it, `x-api-key: <key>`)."""
    if not get_state(request).config.edge.api_keys:
        return
    if OWNER_STATE not in request.scope.get("state", {}):  # the edge names a key it took
        raise Unauthorized(
            "missing or wrong API key: send the header 'Authorization: Bearer <api key>'"
        )
