"""`GET /v1/models` and `GET /v1/models/{id}`: the one served model, its context and modalities."""

from __future__ import annotations

from fastapi import APIRouter
from sparkinfer.api.dependencies import ServerState, State
from sparkinfer.api.schemas.models import ModelCard, ModelList

router = APIRouter()


def model_card(state: ServerState) -> ModelCard:
    modalities = ["text", "image", "video"] if state.has_vision else ["text"]
    return ModelCard(
        id=state.model_id,
        created=state.created,
        root=state.config.model.model or state.model_id,
        max_model_len=state.max_model_len,
        input_modalities=modalities,
    )


@router.get("/v1/models")
async def list_models(state: State) -> ModelList:
    return ModelList(data=[model_card(state)])


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, state: State) -> ModelCard:
    state.check_model(model_id)
    return model_card(state)
