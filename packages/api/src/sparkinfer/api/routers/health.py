"""`GET /health` (liveness of the engine) and `GET /metrics` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sparkinfer.api.dependencies import State
from sparkinfer.api.errors import EngineUnavailable, error_body

router = APIRouter()


@router.get("/health")
async def health(state: State) -> JSONResponse:
    """200 while the engine loop runs; 503 (OpenAI error body) once it has stopped or died."""
    if not state.engine.is_alive():
        err = EngineUnavailable(
            "the engine has stopped (shut down, or its loop died; the cause is in the server "
            "log): restart the server"
        )
        return JSONResponse(error_body(err), status_code=err.status)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
