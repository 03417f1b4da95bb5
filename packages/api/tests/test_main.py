"""Server wiring: /v1/models, /health, /metrics, /v1/tokenize, the API key, start-up settings."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest
from sparkinfer.api.main import main
from sparkinfer.model.embedded import EMBEDDED_MODEL_ID

from .conftest import RunningServer, serve


def test_models_lists_the_embedded_model(server: RunningServer) -> None:
    models = openai.OpenAI(base_url=server.v1, api_key="x").models.list().data
    assert [m.id for m in models] == [EMBEDDED_MODEL_ID]
    card = models[0].model_extra or {}
    assert card["max_model_len"] == 1024
    assert card["input_modalities"] == ["text", "image", "video"]  # the tiny vision tower


def test_health_and_metrics(server: RunningServer) -> None:
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}
    text = httpx.get(server.base_url + "/metrics").text
    for name in (
        "sparkinfer_requests_running",
        "sparkinfer_requests_waiting",
        "sparkinfer_kv_cache_usage_ratio",
        "sparkinfer_state_slot_usage_ratio",
        "sparkinfer_prompt_tokens_total",
        "sparkinfer_generation_tokens_total",
        "sparkinfer_time_to_first_token_seconds_bucket",
        "sparkinfer_inter_token_latency_seconds_bucket",
        "sparkinfer_e2e_request_latency_seconds_bucket",
    ):
        assert name in text


def test_tokenize_and_detokenize_round_trip(server: RunningServer) -> None:
    ids = httpx.post(server.v1 + "/tokenize", json={"prompt": "Hello, world"}).json()["tokens"]
    text = httpx.post(server.v1 + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text == "Hello, world"
    chat = httpx.post(
        server.v1 + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}
    ).json()
    assert chat["count"] == len(chat["tokens"]) and chat["max_model_len"] == 1024


def test_api_key_guards_v1_routes() -> None:
    with serve(api_key="sk-test") as guarded:
        assert httpx.get(guarded.base_url + "/health").status_code == 200
        resp = httpx.get(guarded.v1 + "/models")
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=guarded.v1, api_key="sk-test").models.list()
        assert ok.data[0].id == EMBEDDED_MODEL_ID


def test_bad_setting_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARKINFER_MAX_NUM_SEQS", "-3")
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "SPARKINFER_MAX_NUM_SEQS" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "is_cuda", "expected"),
    [
        (
            ["--block-size", "48"],
            False,
            "--block-size: block_size is 48; it must be a power of two",
        ),
        (
            ["--block-size", "8", "--port", "0"],
            True,
            "--block-size (SPARKINFER_BLOCK_SIZE) on CUDA: block_size is 8",
        ),
    ],
)
def test_bad_block_size_is_one_clear_line_before_anything_loads(
    argv: list[str],
    is_cuda: bool,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch
    from sparkinfer.api import main as main_module

    device = torch.device("cuda" if is_cuda else "cpu")
    monkeypatch.setattr(main_module, "_device", lambda loading: device)
    monkeypatch.setattr(main_module, "build_server", pytest.fail)  # never reached
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and expected in err


def test_a_context_over_the_checkpoints_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkinfer.api import main as main_module

    monkeypatch.setattr(main_module, "build_server", pytest.fail)  # never reached
    with pytest.raises(SystemExit) as info:
        main(["--max-model-len", "99999999", "--device", "cpu", "--port", "0"])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the loading progress
    assert info.value.code == 2 and last.startswith("sparkinfer-api: ")
    assert "--max-model-len" in last and "the checkpoint supports" in last


def test_start_up_logs_the_warm_up_and_draws_no_progress_bars_into_a_log(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """stderr is not a terminal here: no carriage-return bars, a line before and after the
    engine's warm-up."""
    from sparkinfer.api.main import build_state
    from sparkinfer.api.settings import load_settings, server_config

    with caplog.at_level(logging.INFO, logger="sparkinfer.api"):
        state = build_state(server_config(load_settings({"device": "cpu", "max_model_len": 1024})))
    state.engine.shutdown()
    assert "\r" not in capsys.readouterr().err
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("starting the engine") for m in messages)
    assert any(m.startswith("engine ready in") for m in messages)
