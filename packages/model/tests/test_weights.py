"""Loading safetensors checkpoints: both layouts, shards, stored dtypes, groups, named errors."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from sparkinfer.model.errors import CheckpointError, CheckpointNotFound
from sparkinfer.model.weights import (
    checkpoint_views,
    load_model,
    open_checkpoint,
    read_checkpoint_configs,
    resolve_checkpoint,
)


def read_all(ckpt: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def rewrite(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """Copy a checkpoint's configs to dst with its tensors changed by `edit`."""
    dst.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    tensors = read_all(src)
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def cpu32(path: Path):
    return load_model(path, device="cpu", dtype=torch.float32, progress=False)


def test_causal_layout_loads_every_tensor_as_stored(causal_ckpt: Path) -> None:
    views = checkpoint_views(cpu32(causal_ckpt))
    stored = read_all(causal_ckpt)
    assert set(views) == set(stored)
    for name, tensor in stored.items():
        assert torch.equal(views[name], tensor), name


def test_fused_parameters_stack_their_parts_in_row_order(causal_ckpt: Path) -> None:
    model = cpu32(causal_ckpt)
    stored = read_all(causal_ckpt)
    gdn, attn = model.model.layers[0].linear_attn, model.model.layers[3].self_attn
    mlp = model.model.layers[3].mlp

    def cat(layer: int, *names: str) -> torch.Tensor:
        return torch.cat([stored[f"model.layers.{layer}.{n}.weight"] for n in names])

    gdn_in = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z")
    gdn_in += ("linear_attn.in_proj_b", "linear_attn.in_proj_a")
    qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    assert torch.equal(gdn.in_proj.weight, cat(0, *gdn_in))
    assert torch.equal(attn.qkv_proj.weight, cat(3, *qkv))
    assert torch.equal(mlp.gate_up_proj.weight, cat(3, "mlp.gate_proj", "mlp.up_proj"))


def test_conditional_layout_maps_language_model_prefix(conditional_ckpt: Path) -> None:
    model = cpu32(conditional_ckpt)
    params = dict(model.named_parameters())
    stored = read_all(conditional_ckpt)
    views = checkpoint_views(model)
    key = "model.language_model.layers.3.self_attn.q_proj.weight"
    assert torch.equal(views["model.layers.3.self_attn.q_proj.weight"], stored[key])
    assert torch.equal(params["lm_head.weight"], stored["lm_head.weight"])
    ckpt = open_checkpoint(conditional_ckpt, progress=False)
    assert ckpt.vision and all(k.startswith("model.visual.") for k in ckpt.vision)
    assert set(ckpt.text) == set(views)
    # the vision tower is built from vision_config and loaded from model.visual.*
    assert model.has_vision
    assert {f"model.{n}" for n in params if n.startswith("visual.")} == set(ckpt.vision)
    for name in ckpt.vision:
        assert torch.equal(params[name.removeprefix("model.")], stored[name]), name


def test_vision_config_without_vision_tensors_loads_text_only(
    tmp_path: Path, conditional_ckpt: Path
) -> None:
    def drop_vision(t: dict[str, torch.Tensor]) -> None:
        for name in [n for n in t if n.startswith("model.visual.")]:
            del t[name]

    model = cpu32(rewrite(conditional_ckpt, tmp_path / "no_vision", drop_vision))
    assert model.visual is None


def test_missing_vision_tensor_is_named(tmp_path: Path, conditional_ckpt: Path) -> None:
    def drop_one(t: dict[str, torch.Tensor]) -> None:
        del t["model.visual.merger.linear_fc2.bias"]

    with pytest.raises(CheckpointError, match="vision tower tensors are missing"):
        cpu32(rewrite(conditional_ckpt, tmp_path / "partial", drop_one))


def test_sharded_checkpoint_equals_single_file(tmp_path: Path, causal_ckpt: Path) -> None:
    stored = read_all(causal_ckpt)
    shutil.copy(causal_ckpt / "config.json", tmp_path / "config.json")
    names = sorted(stored)
    weight_map = {}
    for i in range(3):
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        part = {n: stored[n] for n in names[i::3]}
        save_file(part, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    views = checkpoint_views(cpu32(tmp_path))
    for name, tensor in stored.items():
        assert torch.equal(views[name], tensor), name
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"lists model-00002-of-00003\.safetensors"):
        cpu32(tmp_path)


def test_vision_and_mtp_tensors_are_returned_apart(tmp_path: Path, conditional_ckpt: Path) -> None:
    def add_mtp(t: dict[str, torch.Tensor]) -> None:
        t["mtp.fc.weight"] = torch.randn(64, 128)
        t["mtp.norm.weight"] = torch.zeros(64)
        t["mtp.layers.0.mlp.up_proj.weight"] = torch.randn(80, 64)

    path = rewrite(conditional_ckpt, tmp_path / "with_mtp", add_mtp)
    ckpt = open_checkpoint(path, progress=False)
    assert set(ckpt.mtp) == {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.mlp.up_proj.weight"}
    mtp = ckpt.read_group("mtp", device="cpu")
    assert mtp["mtp.fc.weight"].shape == (64, 128)
    vision = ckpt.read_group("vision", device="cpu")
    assert vision["model.visual.pos_embed.weight"].shape == (16, 32)
    cpu32(path)  # the text model loads; mtp and vision are not its tensors


def test_stored_f32_a_log_stays_fp32_in_a_bf16_model(tmp_path: Path, causal_ckpt: Path) -> None:
    def to_bf16(t: dict[str, torch.Tensor]) -> None:
        for k, v in t.items():
            if not (k.endswith("A_log") or k.endswith("linear_attn.norm.weight")):
                t[k] = v.to(torch.bfloat16)

    path = rewrite(causal_ckpt, tmp_path / "mixed", to_bf16)
    stored = read_all(path)
    model = load_model(path, device="cpu", dtype=torch.bfloat16, progress=False)
    gdn = model.model.layers[0].linear_attn
    assert gdn.A_log.dtype == torch.float32
    assert torch.equal(gdn.A_log, stored["model.layers.0.linear_attn.A_log"])
    assert gdn.norm.weight.dtype == torch.bfloat16
    assert gdn.in_proj.weight.dtype == torch.bfloat16


def test_missing_tensor_is_named(tmp_path: Path, causal_ckpt: Path) -> None:
    path = rewrite(causal_ckpt, tmp_path / "m", lambda t: t.pop("model.layers.1.linear_attn.A_log"))
    with pytest.raises(
        CheckpointError, match=r"missing tensors model\.layers\.1\.linear_attn\.A_log"
    ):
        cpu32(path)


@pytest.mark.parametrize(
    "name",
    ["model.layers.2.linear_attn.in_proj_z.weight", "model.layers.0.linear_attn.in_proj_a.weight",
     "model.layers.3.self_attn.v_proj.weight", "model.layers.1.mlp.gate_proj.weight"],
)  # fmt: skip
def test_missing_part_of_a_fused_parameter_is_named(
    tmp_path: Path, causal_ckpt: Path, name: str
) -> None:
    path = rewrite(causal_ckpt, tmp_path / "m", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing tensors {re.escape(name)} \("):
        cpu32(path)


def test_wrong_shape_of_a_fused_part_is_named(tmp_path: Path, causal_ckpt: Path) -> None:
    name = "model.layers.3.self_attn.k_proj.weight"  # [2 * 32, 48]; one head too many
    path = rewrite(causal_ckpt, tmp_path / "s", lambda t: t.update({name: torch.zeros(96, 48)}))
    match = r"k_proj\.weight has shape \[96, 48\]; the config expects \[64, 48\]"
    with pytest.raises(CheckpointError, match=match):
        cpu32(path)


def test_unexpected_tensor_is_named(tmp_path: Path, causal_ckpt: Path) -> None:
    def extra(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.7.mlp.up_proj.weight"] = torch.zeros(80, 48)

    path = rewrite(causal_ckpt, tmp_path / "u", extra)
    with pytest.raises(CheckpointError, match=r"unexpected tensors model\.layers\.7\.mlp\.up_proj"):
        cpu32(path)


def test_tensor_outside_any_known_part_is_named(tmp_path: Path, causal_ckpt: Path) -> None:
    def extra(t: dict[str, torch.Tensor]) -> None:
        t["rotary.inv_freq"] = torch.zeros(4)

    path = rewrite(causal_ckpt, tmp_path / "x", extra)
    with pytest.raises(CheckpointError, match=r"unexpected tensors rotary\.inv_freq"):
        open_checkpoint(path, progress=False)


def test_wrong_shape_names_tensor_and_both_shapes(tmp_path: Path, causal_ckpt: Path) -> None:
    name = "model.layers.2.linear_attn.in_proj_qkv.weight"

    def transpose(t: dict[str, torch.Tensor]) -> None:
        t[name] = t[name].t().contiguous()

    path = rewrite(causal_ckpt, tmp_path / "s", transpose)
    match = r"in_proj_qkv\.weight has shape \[48, 112\]; the config expects \[112, 48\]"
    with pytest.raises(CheckpointError, match=match):
        cpu32(path)


def test_local_path_that_does_not_exist(tmp_path: Path, causal_ckpt: Path) -> None:
    with pytest.raises(CheckpointNotFound, match="neither an existing directory nor a hub repo"):
        load_model(tmp_path / "nope", device="cpu", dtype=torch.float32, progress=False)
    shutil.copy(causal_ckpt / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointNotFound, match=r"has neither model\.safetensors"):
        open_checkpoint(tmp_path, progress=False)


def test_hub_id_offline_names_the_id_and_suggests_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointNotFound, match=r"'Qwen/Qwen3\.8-27B'.*local directory path"):
        resolve_checkpoint("Qwen/Qwen3.8-27B", allow_patterns=["*.json"], progress=False)


def test_read_checkpoint_configs(conditional_ckpt: Path) -> None:
    configs = read_checkpoint_configs(conditional_ckpt, progress=False)
    assert configs.path == conditional_ckpt
    assert configs.model.text.num_hidden_layers == 8
    assert configs.generation.eos_token_ids == (2,)


def test_tied_embeddings_need_no_lm_head(tmp_path: Path, causal_ckpt: Path) -> None:
    path = rewrite(causal_ckpt, tmp_path / "tied", lambda t: t.pop("lm_head.weight"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    model = cpu32(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    stored = read_all(causal_ckpt)
    assert torch.equal(model.lm_head.weight, stored["model.embed_tokens.weight"])
