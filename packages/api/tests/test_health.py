"""`/health` follows the engine thread: 503 with an OpenAI error body once it has stopped."""

from __future__ import annotations

import httpx

from .conftest import serve


def test_health_is_503_once_the_engine_stopped() -> None:
    with serve() as app:
        assert httpx.get(app.base_url + "/health").json() == {"status": "ok"}
        state = app.app.state.server  # type: ignore[attr-defined]
        state.engine.engine.shutdown()  # the engine alone, behind the server's back
        resp = httpx.get(app.base_url + "/health")
        assert resp.status_code == 503
        err = resp.json()["error"]
        assert (err["type"], err["code"]) == ("server_error", "engine_unavailable")
        assert "restart" in err["message"]
        body = {"model": state.model_id, "prompt": "hi", "max_tokens": 1}
        refused = httpx.post(app.v1 + "/completions", json=body)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "engine_unavailable"
