"""Loading drafters: each published layout (random weights, shrunk) loads from a directory or a
hub id for its target and drafts from the target's tapped states; a mismatched or malformed
checkpoint is refused naming what does not fit."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
import torch
from safetensors.torch import load_file, save_file
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.cache import allocate_drafter_cache
from sparkinfer.model.drafters.weights import load_drafter
from sparkinfer.model.errors import CheckpointError, ConfigError
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.weights import load_model

sys.path.insert(0, str(Path(__file__).parent))
from drafter_checkpoints import PUBLISHED, shrink, write_drafter
from fake_hub import FakeHub


@pytest.fixture(scope="module")
def target(conditional_ckpt: Path) -> Qwen3_8ForCausalLM:
    """8 layers, hidden 64, vocabulary 320."""
    return load_model(conditional_ckpt, device="cpu", dtype=torch.float32, progress=False)


def small(name: str) -> dict:
    return shrink(PUBLISHED[name], hidden=64, vocab=320, num_layers=8)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_each_published_layout_loads_and_drafts(name, target, tmp_path: Path, paged_runner) -> None:
    path = write_drafter(tmp_path / "drafter", small(name))
    drafter = load_drafter(path, target, progress=False)
    stored = load_file(str(path / "model.safetensors"))
    params = dict(drafter.named_parameters())
    for key, tensor in stored.items():
        assert torch.equal(params[key], tensor), key
    assert target.tap_layers == drafter.config.target_layer_ids
    assert drafter.shared.lm_head is target.lm_head
    # the target's prefill gives the context; the block starts at its sampled token
    runner = paged_runner(target, max_lens=[12])
    prompt = torch.arange(3, 14)
    batch = ForwardBatch.build(
        [len(prompt)], [0], runner.tables, runner.slots, caches=runner.caches, block_size=16,
        device="cpu",
    )  # fmt: skip
    out = target.forward_tapped(prompt, batch)
    # the drafter's K/V paged with the target's block table
    cache = allocate_drafter_cache(
        drafter.cache_spec(), num_blocks=len(runner.tables[0]) + 2, block_size=16, device="cpu"
    )
    tables = torch.tensor([runner.tables[0] + [0]])  # a spare page: context + one block
    seq = torch.zeros(11, dtype=torch.int64)
    drafter.write_context(out.tapped, torch.arange(11), cache, block_tables=tables, seq_ids=seq)
    anchor = target.compute_logits(out.hidden[-1:]).argmax(-1)
    draft = drafter.propose(
        anchor, torch.tensor([11]), cache, block_tables=tables, num_keys=11 + 16
    )
    tokens = drafter.draft_tokens(draft, anchor).tokens
    assert tokens.shape == (1, drafter.config.num_drafts)
    assert torch.isfinite(draft.logits).all()


def test_a_drafter_for_another_target_is_refused_before_its_tensors(target, tmp_path) -> None:
    data = small("z-lab/Qwen3.6-27B-DFlash")
    path = write_drafter(tmp_path / "drafter", data)
    (path / "model.safetensors").unlink()  # never read: the config already does not fit
    (path / "model.safetensors").write_bytes(b"")
    data["dflash_config"]["target_layer_ids"] = [1, 9]
    (path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"target_layer_ids \[1, 9\] must be .*\[0, 7\]"):
        load_drafter(path, target, progress=False)


def _rewrite(path: Path, change) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda t: t.pop("layers.4.mlp.up_proj.weight"),
            r"lacks \['layers.4.mlp.up_proj.weight'\]",
        ),
        (lambda t: t.update(extra=torch.zeros(2)), r"unexpected drafter tensors \['extra'\]"),
        (lambda t: t.update({"fc.weight": torch.zeros(64, 64)}), r"fc.weight has shape \[64, 64\]"),
        (lambda t: t.update({"lm_head.weight": torch.zeros(300, 64)}), "lm_head.weight has shape"),
    ],
)
def test_malformed_checkpoints_name_the_tensor(target, tmp_path, change, message) -> None:
    path = write_drafter(tmp_path / "drafter", small("RadixArk/Qwen3.8-27B-DSpark"))
    _rewrite(path, change)
    with pytest.raises(CheckpointError, match=message):
        load_drafter(path, target, progress=False)


def test_target_copies_and_suffixed_codebooks_are_accepted(target, tmp_path) -> None:
    """DeepSpec exports may carry the target's embedding and head (not read); DFlash2's
    codebooks may be stored with a `.weight` suffix."""
    path = write_drafter(tmp_path / "drafter", small("Qwen3.8-27B-DFlash2"))

    def change(t: dict[str, torch.Tensor]) -> None:
        t["embed_tokens.weight"] = torch.zeros(320, 64)
        name = "candidate_selector.successor_codebook"
        t[name + ".weight"] = t.pop(name)

    _rewrite(path, change)
    drafter = load_drafter(path, target, progress=False)
    assert drafter.candidate_selector is not None


@pytest.fixture
def drafter_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    repo = "sparkinfer-test/dspark"
    src = write_drafter(tmp_path / "src", small("RadixArk/Qwen3.8-27B-DSpark"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with FakeHub({repo: src}) as hub:
        monkeypatch.setattr(hf_constants, "ENDPOINT", hub.url)
        template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        yield repo


def test_a_hub_id_downloads_and_loads(target, drafter_hub: str) -> None:
    drafter = load_drafter(drafter_hub, target, progress=False)
    assert drafter.markov_head is not None and drafter.confidence_head is not None
