"""The random checkpoint writer: the loader reads what it writes, MTP head included."""

from pathlib import Path

import pytest
import torch
from sparkinfer.lab.random_checkpoint import (
    checkpoint_bytes,
    checkpoint_shards,
    config_json,
    tiny_config,
    write_random_checkpoint,
)
from sparkinfer.model.config import load_model_config, parse_model_config
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    folder = tmp_path_factory.mktemp("random-checkpoint")
    size = write_random_checkpoint(folder, tiny_config(), device=torch.device("cpu"))
    return folder, size


def test_the_config_round_trips_through_the_parser() -> None:
    config = tiny_config()
    assert parse_model_config(config_json(config.text)).text == config.text


def test_the_loader_loads_the_folder_and_auto_finds_the_mtp_head(written) -> None:
    folder, size = written
    assert size == checkpoint_bytes(tiny_config())
    assert load_model_config(folder).text == tiny_config().text
    model = load_model(folder, device="cpu", dtype=torch.float32, progress=False, use_mtp="auto")
    assert model.mtp is not None
    assert bool(model.model.norm.weight.eq(0).all())  # (1 + w) norms start as the identity
    assert model.mtp.fc.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert Tokenizer.from_checkpoint(folder).vocab_size <= tiny_config().text.vocab_size


def test_each_layer_has_its_own_shard_and_the_head_its_mtp_names() -> None:
    shards = checkpoint_shards(tiny_config())
    assert [s for s in shards if "layer" in s] == [
        f"model-layer-{i:03d}.safetensors" for i in range(4)
    ]
    mtp = {spec.name for spec in shards["model-mtp.safetensors"]}
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= mtp
    assert {"mtp.layers.0.mlp.gate_proj.weight", "mtp.layers.0.mlp.up_proj.weight"} <= mtp
