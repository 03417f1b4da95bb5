"""config.json / generation_config.json parsing: both layouts, defaults, and named errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from sparkinfer.model.config import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    GenerationDefaults,
    load_generation_defaults,
    load_model_config,
    parse_generation_defaults,
    parse_model_config,
)
from sparkinfer.model.embedded import RANDOM_CONFIG
from sparkinfer.model.errors import ConfigError, UnsupportedCheckpoint

TEXT = RANDOM_CONFIG["text_config"]


def conditional(**top: Any) -> dict[str, Any]:
    data = copy.deepcopy(RANDOM_CONFIG)
    data["vision_config"] = {
        "model_type": "qwen3_5",  # as in the shipped files; transformers renames it
        "depth": 27,
        "hidden_size": 1152,
        "num_heads": 16,
        "intermediate_size": 4304,
        "out_hidden_size": 5120,
        "deepstack_visual_indexes": [],
    }
    data.update(top)
    return data


def text_only(**fields: Any) -> dict[str, Any]:
    data = {**copy.deepcopy(TEXT), "architectures": ["Qwen3_5ForCausalLM"], **fields}
    return {k: v for k, v in data.items() if v is not None}


def test_parses_conditional_generation_layout() -> None:
    config = parse_model_config(conditional())
    assert config.architecture == "Qwen3_5ForConditionalGeneration"
    assert config.image_token_id == 248056 and config.vision_end_token_id == 248054
    assert config.vision is not None and config.vision.depth == 27
    assert config.vision.hidden_size // config.vision.num_heads == 72
    assert config.text.linear_conv_dim == 2 * 128 + 256
    assert config.context_len == config.max_position_embeddings == 262144


def test_parses_text_only_layout() -> None:
    config = parse_model_config(text_only())
    assert config.model_type == "qwen3_5_text" and config.vision is None
    assert config.architecture == "Qwen3_5ForCausalLM"
    assert config.text.eos_token_ids == (248044,)


def test_layer_types_default_from_full_attention_interval() -> None:
    config = parse_model_config(text_only(layer_types=None, full_attention_interval=4))
    assert config.text.full_attention_layers == (3, 7)
    assert config.text.layer_types[:4] == (LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)


def test_transformers_written_configs_parse(causal_ckpt: Path, conditional_ckpt: Path) -> None:
    assert load_model_config(causal_ckpt).text.rotary_dim == 8
    config = load_model_config(conditional_ckpt)
    assert config.text.num_hidden_layers == 8 and config.vision is not None


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (text_only(model_type="qwen3_next"), "model_type"),
        (conditional(architectures=["Qwen3_5ForSequenceClassification"]), "architectures"),
        (text_only(attention_bias=True), "attention_bias"),
        (text_only(hidden_act="gelu"), "hidden_act"),
        (text_only(attn_output_gate=False), "attn_output_gate"),
        (text_only(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
        (
            text_only(rope_parameters={**TEXT["rope_parameters"], "rope_type": "yarn"}),
            "rope_parameters.rope_type",
        ),
        (
            text_only(rope_parameters={**TEXT["rope_parameters"], "mrope_interleaved": False}),
            "rope_parameters.mrope_interleaved",
        ),
        (text_only(layer_types=["linear_attention"] * 7 + ["sliding_attention"]), "layer_types"),
    ],
)
def test_unsupported_features_name_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(UnsupportedCheckpoint, match=field.replace(".", r"\.")):
        parse_model_config(data)


@pytest.mark.parametrize("field", ["hidden_size", "linear_num_value_heads", "head_dim"])
def test_missing_text_field_is_named(field: str) -> None:
    data = conditional()
    del data["text_config"][field]
    with pytest.raises(ConfigError, match=rf"text_config\.{field} is missing"):
        parse_model_config(data)


def test_missing_model_type_and_text_config_are_named() -> None:
    with pytest.raises(ConfigError, match="model_type is missing"):
        parse_model_config({"text_config": TEXT})
    with pytest.raises(ConfigError, match="text_config is missing"):
        parse_model_config({"model_type": "qwen3_5"})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"hidden_size": "256"}, r"hidden_size is '256' \(str\); expected int"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
        ({"linear_num_value_heads": 6}, "not a multiple of linear_num_key_heads"),
        ({"num_hidden_layers": 4}, "layer_types has 8 entries; num_hidden_layers is 4"),
        ({"vocab_size": 0}, "vocab_size is 0; it must be >= 1"),
        ({"tie_word_embeddings": 1}, "tie_word_embeddings is 1"),
    ],
)
def test_invalid_values_are_named(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_model_config(text_only(**fields))


def test_top_level_tie_word_embeddings_wins() -> None:
    assert parse_model_config(conditional(tie_word_embeddings=True)).text.tie_word_embeddings


def test_generation_defaults_from_file_and_fallbacks(tmp_path: Path) -> None:
    config = parse_model_config(conditional())
    assert load_generation_defaults(tmp_path, config=config) == GenerationDefaults(
        eos_token_ids=(248044,)
    )
    qwen = {"eos_token_id": [248046, 248044], "do_sample": True, "temperature": 1.0,
            "top_k": 20, "top_p": 0.95}  # fmt: skip
    (tmp_path / "generation_config.json").write_text(json.dumps(qwen))
    defaults = load_generation_defaults(tmp_path, config=config)
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (1.0, 20, 0.95)
    assert defaults.eos_token_ids == (248046, 248044)
    greedy = parse_generation_defaults({"do_sample": False, "temperature": 0.7}, config=config)
    assert greedy.temperature == 0.0 and greedy.eos_token_ids == (248044,)


def test_generation_defaults_reject_bad_values() -> None:
    config = parse_model_config(conditional())
    with pytest.raises(ConfigError, match=r"generation_config\.top_p is 1\.5"):
        parse_generation_defaults({"top_p": 1.5}, config=config)


def test_missing_or_broken_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json does not exist"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_model_config(tmp_path)
