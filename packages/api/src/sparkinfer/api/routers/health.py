"""`GET /health` (liveness of the engine) and `GET /metrics` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sparkinfer.api.dependencies import State

router = APIRouter()


@router.get("/health")
async def health(state: State) -> JSONResponse:
    """200 while the engine loop runs; 503 once it has stopped or died."""
    if not state.engine.is_alive():
        return JSONResponse({"status": "engine stopped"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
