"""`--draft-model`: a drafter for the served model loads; one for another model, or malformed,
stops start-up in one line naming the setting, before the model's weights load."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest
import torch
from sparkinfer.api.draft_model import check_draft_model, load_draft_model
from sparkinfer.api.main import main
from sparkinfer.api.settings import SettingsError, load_settings, server_config
from sparkinfer.model import embedded
from sparkinfer.model.weights import load_model

MODEL_TESTS = Path(__file__).resolve().parents[2] / "model" / "tests"
_TARGET = json.loads((embedded.embedded_checkpoint_dir() / "config.json").read_text())
HIDDEN = _TARGET.get("text_config", _TARGET)["hidden_size"]  # the embedded model's


def _drafter(tmp_path: Path, **change) -> Path:
    """The published Qwen3.6-27B DFlash layout shrunk to the embedded model (8 layers, its
    hidden size, 8192 ids), random weights."""
    sys.path.insert(0, str(MODEL_TESTS))
    from drafter_checkpoints import PUBLISHED, shrink, write_drafter

    cfg = shrink(PUBLISHED["z-lab/Qwen3.6-27B-DFlash"], hidden=HIDDEN, vocab=8192, num_layers=8)
    cfg.update(change)
    return write_drafter(tmp_path / "drafter", cfg)


def test_a_drafter_for_the_embedded_model_loads(tmp_path: Path) -> None:
    settings = load_settings({"draft_model": str(_drafter(tmp_path))}, environ={})
    config = check_draft_model(server_config(settings))
    assert config is not None and config.num_drafts == 15
    model = load_model(
        embedded.embedded_checkpoint_dir(), device="cpu", dtype=torch.float32, progress=False
    )
    drafter = load_draft_model(server_config(settings), model)
    assert drafter is not None and model.tap_layers == config.target_layer_ids


def test_without_the_setting_nothing_is_checked_or_loaded() -> None:
    settings = load_settings({}, environ={})
    assert check_draft_model(server_config(settings)) is None
    assert load_draft_model(server_config(settings), None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 128}, f"hidden_size is 128; the target model's is {HIDDEN}"),
        ({"architectures": ["Qwen3ForCausalLM"]}, "architectures is \\['Qwen3ForCausalLM'\\]"),
    ],
)
def test_a_mismatched_drafter_stops_start_up_before_the_model_loads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: dict,
    message: str,
) -> None:
    from sparkinfer.api import main as main_module

    path = _drafter(tmp_path, **change)
    monkeypatch.setattr(main_module, "_load_checkpoint", pytest.fail)  # never reached
    with pytest.raises(SystemExit) as info:
        main(["--draft-model", str(path), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert info.value.code == 2 and err.startswith("sparkinfer-api: invalid setting --draft-model")
    assert "SPARKINFER_DRAFT_MODEL" in err and re.search(message, err)


def test_a_missing_tensor_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    path = _drafter(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["norm.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    settings = load_settings({"draft_model": str(path)}, environ={})
    model = load_model(
        embedded.embedded_checkpoint_dir(), device="cpu", dtype=torch.float32, progress=False
    )
    with pytest.raises(SettingsError, match=r"--draft-model .*lacks \['norm.weight'\]"):
        load_draft_model(server_config(settings), model)


def test_tensor_parallel_is_refused(tmp_path: Path) -> None:
    settings = load_settings(
        {"draft_model": str(_drafter(tmp_path)), "tensor_parallel_size": 2}, environ={}
    )
    with pytest.raises(SettingsError, match="one GPU for now"):
        check_draft_model(server_config(settings))


def test_the_engine_drafts_with_the_loaded_drafter_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sparkinfer.api.main import build_state
    from sparkinfer.scheduler.speculative.block_drafter import DraftModelDrafter

    settings = load_settings({"draft_model": str(_drafter(tmp_path)), "device": "cpu"}, environ={})
    with caplog.at_level(logging.INFO):
        state = build_state(server_config(settings))
    try:
        runner = state.engine.engine.runner
        assert isinstance(runner.speculative.drafter, DraftModelDrafter)  # type: ignore[attr-defined]
        assert "speculative auto: the block drafter of --draft-model drafts up to 15" in caplog.text
        assert getattr(runner.model, "mtp", None) is None  # no MTP head loaded beside it
    finally:
        state.engine.shutdown()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"speculative": "mtp"}, "--draft-model drafts with --speculative auto or draft_model"),
        ({"speculative": "draft_model", "draft_model": None}, "--speculative draft_model"),
    ],
)
def test_a_speculative_method_that_does_not_fit_the_draft_model_is_refused(
    tmp_path: Path, values: dict, message: str
) -> None:
    settings = load_settings({"draft_model": str(_drafter(tmp_path)), **values}, environ={})
    with pytest.raises(SettingsError, match=message):
        check_draft_model(server_config(settings))
