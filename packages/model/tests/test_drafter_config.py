"""Drafter configs: each published layout parses (shrunk to a small target); what does not fit
the target, or is not implemented, is refused with one line naming it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sparkinfer.model.config import parse_text_config
from sparkinfer.model.drafters.config import (
    DFLASH,
    DFLASH2,
    DSPARK,
    check_drafter_fits,
    parse_drafter_config,
)
from sparkinfer.model.errors import ConfigError, UnsupportedCheckpoint

sys.path.insert(0, str(Path(__file__).parent))
from drafter_checkpoints import PUBLISHED, shrink

from conftest import TEXT_WIDE

TARGET = parse_text_config(TEXT_WIDE)


def small(name: str) -> dict:
    return shrink(PUBLISHED[name], hidden=64, vocab=320, num_layers=8)


@pytest.mark.parametrize(
    ("name", "layout", "drafts", "windows", "taps"),
    [
        ("z-lab/Qwen3.5-27B-DFlash", DFLASH, 15, (None,) * 5, (1, 16, 31, 46, 61)),
        ("z-lab/Qwen3.6-27B-DFlash", DFLASH, 15, (2048,) * 4 + (None,), (1, 16, 31, 46, 61)),
        ("Qwen3.8-27B-DFlash2", DFLASH2, 7, (2048,) * 5, (5, 19, 33, 47, 61)),
        ("RadixArk/Qwen3.8-27B-DSpark", DSPARK, 7, (None,) * 5, (5, 19, 33, 47, 61)),
    ],
)
def test_published_configs_parse(name, layout, drafts, windows, taps) -> None:
    config = parse_drafter_config(PUBLISHED[name])
    assert (config.layout, config.num_drafts, config.sliding_windows) == (layout, drafts, windows)
    assert config.target_layer_ids == taps
    assert (config.mask_token_id, config.rope_theta, config.is_causal) == (248070, 1e7, False)
    assert (config.head_dim, config.num_key_value_heads) == (128, 8)
    target = parse_text_config({**TEXT_WIDE, "hidden_size": 5120, "vocab_size": 248320,
                                "num_hidden_layers": 64})  # fmt: skip
    check_drafter_fits(config, target)


def test_layout_extras_are_read() -> None:
    dflash2 = parse_drafter_config(PUBLISHED["Qwen3.8-27B-DFlash2"])
    assert (dflash2.conv_kernel_size, dflash2.conv_group_size) == (2, 16)
    assert (dflash2.selector_rank, dflash2.selector_top_k) == (256, 16)
    dspark = parse_drafter_config(PUBLISHED["RadixArk/Qwen3.8-27B-DSpark"])
    assert (dspark.markov_rank, dspark.has_confidence_head, dspark.confidence_with_markov) == (
        256, True, True,
    )  # fmt: skip
    assert dspark.is_shifted and not dflash2.is_shifted


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 48}, "drafter's hidden_size is 48; the target model's is 64"),
        ({"vocab_size": 300}, "drafter's vocab_size is 300; the target model's is 320"),
        ({"num_target_layers": 64}, "num_target_layers is 64; the target model's is 8"),
        ({"dflash_config": {"target_layer_ids": [0, 8]}}, r"target_layer_ids \[0, 8\].*\[0, 7\]"),
        ({"dflash_config": {"target_layer_ids": [-1, 3]}}, r"target_layer_ids \[-1, 3\]"),
        ({"dflash_config": {"mask_token_id": 320}}, "mask_token_id 320 is outside"),
    ],
)
def test_a_drafter_for_another_target_is_refused(change, message) -> None:
    data = small("z-lab/Qwen3.6-27B-DFlash")
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ConfigError, match=message):
        check_drafter_fits(parse_drafter_config(data), TARGET)


def test_dspark_may_tap_the_embeddings() -> None:
    data = small("RadixArk/Qwen3.8-27B-DSpark")
    data["dflash_config"]["target_layer_ids"] = [-1, 3, 7]
    check_drafter_fits(parse_drafter_config(data), TARGET)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "architectures is .*supported block drafters"),
        ({"markov_head_type": "rnn"}, "markov_head_type is 'rnn'"),
        ({"rope_theta": None, "rope_parameters": {"rope_type": "yarn"}}, "rope_type is 'yarn'"),
        ({"attention_bias": True}, "attention_bias is True"),
        ({"block_size": 17}, "block_size 17 gives 17 drafts"),
        ({"draft_vocab_size": 32000}, "draft_vocab_size differs"),
        ({"layer_types": ["chunked_attention"] * 5}, "layer_types holds 'chunked_attention'"),
    ],
)
def test_what_sparkinfer_does_not_run_is_named(change, message) -> None:
    data = {**small("RadixArk/Qwen3.8-27B-DSpark"), **change}
    with pytest.raises(UnsupportedCheckpoint, match=message):
        parse_drafter_config(data)
