"""Tensor parallel on CPU: two gloo processes give the whole model's logits (plan, layers,
sharded loading), on the embedded checkpoint and on a random one with one replicated KV head."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from sparkinfer.model import embedded
from sparkinfer.model.config import load_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.errors import ConfigError
from sparkinfer.model.parallel.plan import ShardPlan
from sparkinfer.model.weights import checkpoint_views, load_model

RANK_SCRIPT = Path(__file__).with_name("tensor_parallel_rank.py")
sys.path.insert(0, str(RANK_SCRIPT.parent))
from tensor_parallel_rank import run_rank, run_steps  # noqa: E402

ATOL = 1e-4  # fp32: the split sums differ from the whole GEMMs in rounding only


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(ckpts: list[Path]) -> list[list[torch.Tensor]]:
    """Rank 1 in a child process, rank 0 here: rank 0's logits of each checkpoint."""
    port, names = free_port(), [str(c) for c in ckpts]
    rank1 = subprocess.Popen([sys.executable, str(RANK_SCRIPT), "1", "2", str(port), *names])
    try:
        logits = run_rank(0, 2, port, names)
    finally:
        assert rank1.wait(timeout=120) == 0
    return logits


def random_checkpoint(dst: Path) -> Path:
    """The embedded config with one KV head (replicated at size 2), an odd vocabulary (a padded
    last shard) and an untied head, filled with seeded noise."""
    src = embedded.embedded_checkpoint_dir()
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    cfg["text_config"].update(num_key_value_heads=1, vocab_size=8191, tie_word_embeddings=False)
    cfg.pop("vision_config", None)
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(cfg))
    shutil.copy(src / "generation_config.json", dst / "generation_config.json")
    model = Qwen3_8ForCausalLM(load_model_config(dst), device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    tensors = {
        name: (torch.randn(view.shape, generator=gen) * 0.05).to(torch.bfloat16)
        for name, view in checkpoint_views(model).items()
    }
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_two_ranks_give_the_whole_models_logits(tmp_path: Path) -> None:
    """The embedded checkpoint (2 KV heads split) and a random one (1 KV head replicated)."""
    ckpts = [embedded.embedded_checkpoint_dir(), random_checkpoint(tmp_path / "ckpt")]
    for ckpt, got in zip(ckpts, run_two_ranks(ckpts), strict=True):
        expected = run_steps(load_model(ckpt, device="cpu", dtype=torch.float32, progress=False))
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, atol=ATOL, rtol=0)
            assert torch.equal(g.argmax(-1), e.argmax(-1))


def test_plan_replicates_kv_heads_when_the_size_is_their_multiple() -> None:
    text = load_model_config(embedded.embedded_checkpoint_dir()).text  # 4 q, 2 kv heads
    plans = [ShardPlan(text, r, 4) for r in range(4)]
    assert [list(p.q_heads) for p in plans] == [[0], [1], [2], [3]]
    assert [list(p.kv_heads) for p in plans] == [[0], [0], [1], [1]]
    assert [list(p.k_heads) for p in plans] == [[0], [1], [2], [3]]
    assert [list(p.v_heads) for p in plans] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_plan_names_the_field_a_size_cannot_split() -> None:
    text = load_model_config(embedded.embedded_checkpoint_dir()).text
    with pytest.raises(ConfigError, match="num_attention_heads is 4; tensor_parallel_size 3"):
        ShardPlan(text, 0, 3)


def test_plan_at_27b_shapes_on_eight_ranks() -> None:
    """24 q / 4 kv heads: three query heads and one KV head per rank, each KV head on the two
    ranks whose queries read it; 16 / 48 Gated-DeltaNet heads: two key and six value heads."""
    text = dataclasses.replace(
        load_model_config(embedded.embedded_checkpoint_dir()).text,
        num_attention_heads=24,
        num_key_value_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        intermediate_size=17_408,
        vocab_size=248_320,
    )
    plans = [ShardPlan(text, r, 8) for r in range(8)]
    assert [list(p.q_heads) for p in plans[:3]] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [p.kv_heads.start for p in plans] == [0, 0, 1, 1, 2, 2, 3, 3]
    group = text.num_attention_heads // text.num_key_value_heads
    assert all(q // group == p.kv_heads.start for p in plans for q in p.q_heads)
    assert [len(p.k_heads) for p in plans] == [2] * 8 and list(plans[7].v_heads) == [*range(42, 48)]
    local = plans[0].local_text()
    assert (local.num_attention_heads, local.num_key_value_heads) == (3, 1)
    assert local.intermediate_size == 2176 and plans[0].vocab_shard_len == 31_040
