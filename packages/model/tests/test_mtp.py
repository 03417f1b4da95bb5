"""The MTP head against transformers' decoder layer (the training reference's head, Qwen's
layout), on a random checkpoint with `mtp.*` tensors written here: a prompt's rows in one paged
prefill, then row by row as drafts are made."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.errors import CheckpointError
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.weights import load_model
from torch import nn


class ReferenceMTP(nn.Module):
    """The head as transformers computes it: fc over [norm(embed) | norm(hidden)], one
    full-attention Qwen3.5 decoder layer over the whole row sequence (causal), then the norm."""

    def __init__(self, text_config) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

        super().__init__()
        cfg = copy.deepcopy(text_config)
        cfg.num_hidden_layers, cfg.layer_types = 1, ["full_attention"]
        cfg._attn_implementation = "sdpa"  # causal without a mask, as the training reference
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(cfg, 0)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        self.rotary = Qwen3_5TextRotaryEmbedding(cfg)

    def forward(self, embeds, hidden, positions):  # [1, L, H], [1, L, H], [L]
        x = self.fc(
            torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        )
        pos = positions.view(1, 1, -1).expand(3, 1, -1)
        out = self.layers[0](
            x, position_embeddings=self.rotary(x, pos), attention_mask=None, position_ids=pos[0]
        )
        return self.norm(out[0] if isinstance(out, tuple) else out)


@pytest.fixture(scope="module")
def mtp_ckpt(
    tmp_path_factory: pytest.TempPathFactory, causal_ckpt: Path
) -> tuple[Path, ReferenceMTP]:
    """The causal checkpoint plus a random head's `mtp.*` tensors; the head as a reference."""
    from transformers import Qwen3_5TextConfig

    path = tmp_path_factory.mktemp("mtp")
    for name in ("config.json", "generation_config.json"):
        shutil.copy(causal_ckpt / name, path / name)
    ref = ReferenceMTP(Qwen3_5TextConfig.from_pretrained(causal_ckpt)).eval()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else 0.08
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    with safe_open(str(causal_ckpt / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    tensors |= {
        f"mtp.{k}": v.contiguous() for k, v in ref.state_dict().items() if "rotary" not in k
    }
    save_file(tensors, str(path / "model.safetensors"))
    return path, ref


def test_the_head_matches_the_reference_in_one_prefill_and_row_by_row(mtp_ckpt):
    path, ref = mtp_ckpt
    model = load_model(path, device="cpu", dtype=torch.float32, progress=False, use_mtp=True)
    head = model.mtp
    assert head is not None
    spec = model.cache_spec()
    assert [s.layer_idx for s in spec.attention] == [3, head.cache_idx]
    gen = torch.Generator().manual_seed(0)
    num_rows, num_prefill, block_size = 21, 17, 4
    next_ids = torch.randint(0, 300, (num_rows,), generator=gen)
    hidden = torch.randn(num_rows, model.config.text.hidden_size, generator=gen)
    embeds = model.embed_input_ids(next_ids)
    positions = torch.arange(1, num_rows + 1)  # row p pairs H_p with the token at p + 1
    with torch.no_grad():
        want = ref(embeds[None], hidden[None], positions)[0]
    caches = allocate_caches(spec, num_blocks=8, block_size=block_size, num_slots=1, device="cpu")
    table = [7, 2, 5, 1, 6, 3]  # shuffled pages
    got = []
    for start, end in [(0, num_prefill), *((i, i + 1) for i in range(num_prefill, num_rows))]:
        batch = ForwardBatch.build(
            [end - start], [start], [table], [0], caches=caches, block_size=block_size,
            device="cpu", positions=positions[start:end],
        )  # fmt: skip
        got.append(head(embeds[start:end], hidden[start:end], batch))
    torch.testing.assert_close(torch.cat(got), want, atol=2e-5, rtol=1e-4)


def test_a_checkpoint_without_mtp_tensors_is_named(tmp_path: Path, mtp_ckpt) -> None:
    src, _ = mtp_ckpt
    dst = tmp_path / "partial"
    dst.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != "mtp.fc.weight"}  # noqa: SIM118
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no mtp\.fc\.weight"):
        load_model(dst, device="cpu", dtype=torch.float32, progress=False, use_mtp=True)
    config = json.loads((src / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text"


def test_use_mtp_auto_builds_the_head_only_where_the_checkpoint_has_one(
    tmp_path: Path, mtp_ckpt
) -> None:
    src, _ = mtp_ckpt
    assert load_model(src, device="cpu", dtype=torch.float32, progress=False, use_mtp="auto").mtp
    dst = tmp_path / "text-only"
    dst.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("mtp.")}  # noqa: SIM118
    save_file(tensors, str(dst / "model.safetensors"))
    model = load_model(dst, device="cpu", dtype=torch.float32, progress=False, use_mtp="auto")
    assert getattr(model, "mtp", None) is None
