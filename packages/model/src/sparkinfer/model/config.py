"""Checkpoint config (config.json, generation_config.json) parsed into frozen dataclasses.

Two layouts are accepted, both of model family Qwen3.5 / Qwen3.8:
- `model_type: qwen3_5` with a `text_config` and an optional `vision_config`
  (ForConditionalGeneration);
- `model_type: qwen3_5_text`, the text config alone (ForCausalLM).
Anything this package does not implement raises `UnsupportedCheckpoint` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkinfer.model.errors import ConfigError, UnsupportedCheckpoint

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
SUPPORTED_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM")
_MISSING: Any = object()
_POSITIVE_TEXT_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "max_position_embeddings",
)  # fmt: skip


@dataclass(frozen=True)
class TextConfig:
    """The language model: hybrid Gated-DeltaNet / gated-attention stack (model.md §1, §4-§6)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, int, int] = (11, 11, 10)
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in _POSITIVE_TEXT_FIELDS:
            if getattr(self, name) < 1:
                raise ConfigError(f"text_config.{name} is {getattr(self, name)}; it must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"text_config.num_attention_heads ({self.num_attention_heads}) is not a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads}): fix the config"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"text_config.linear_num_value_heads ({self.linear_num_value_heads}) is not a "
                f"multiple of linear_num_key_heads ({self.linear_num_key_heads}): fix the config"
            )
        if self.linear_conv_kernel_dim < 2:
            raise ConfigError(
                f"text_config.linear_conv_kernel_dim is {self.linear_conv_kernel_dim}; "
                "it must be >= 2"
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"text_config.layer_types has {len(self.layer_types)} entries; num_hidden_layers "
                f"is {self.num_hidden_layers}: give one type per layer"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in (LINEAR_ATTENTION, FULL_ATTENTION):
                raise UnsupportedCheckpoint(
                    f"text_config.layer_types[{i}] is {kind!r}; supported: "
                    f"{LINEAR_ATTENTION!r}, {FULL_ATTENTION!r}"
                )
        rotary = self.head_dim * self.partial_rotary_factor
        if rotary != int(rotary) or int(rotary) % 2 or not 0 < rotary <= self.head_dim:
            raise ConfigError(
                f"rope_parameters.partial_rotary_factor {self.partial_rotary_factor} times "
                f"head_dim {self.head_dim} gives {rotary} rotary dims; it must be an even "
                "integer <= head_dim"
            )

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each q/k head that rotate (64 for the 27B model)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the causal conv: contiguous [q | k | v]."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's config, parsed data for `vision.py` (model.md §1 vision_config)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    hidden_act: str = "gelu_pytorch_tanh"
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = ()
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"vision_config.hidden_size ({self.hidden_size}) is not a multiple of num_heads "
                f"({self.num_heads}): fix the config"
            )


FP8_BLOCK = 128  # rows and columns of a weight's scale block (Qwen's fine-grained FP8)
_QUANTIZATION_FIELDS = (
    "quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert",
)  # fmt: skip


@dataclass(frozen=True)
class QuantizationConfig:
    """Block-scaled FP8 weights as Qwen publishes them (`quantization_config`, fine-grained FP8).

    Each quantized `X.weight` is float8_e4m3fn with `X.weight_scale_inv` [ceil(N/128),
    ceil(K/128)] fp32 beside it; activations are quantized at run time (dynamic). The modules
    in modules_to_not_convert (checkpoint names, `model.language_model.` read as `model.`)
    stay in the checkpoint's dtype.
    """

    quant_method: str = "fp8"
    fmt: str = "e4m3"
    activation_scheme: str = "dynamic"
    weight_block_size: tuple[int, ...] = (FP8_BLOCK, FP8_BLOCK)
    modules_to_not_convert: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("quant_method", self.quant_method, "fp8"),
            ("fmt", self.fmt, "e4m3"),
            ("activation_scheme", self.activation_scheme, "dynamic"),
        ):
            if value != allowed:
                raise UnsupportedCheckpoint(
                    f"quantization_config.{name} is {value!r}; sparkinfer supports only "
                    f"{allowed!r} (Qwen's fine-grained FP8)"
                )
        if tuple(self.weight_block_size) != (FP8_BLOCK, FP8_BLOCK):
            raise UnsupportedCheckpoint(
                f"quantization_config.weight_block_size is {list(self.weight_block_size)}; "
                f"sparkinfer supports only [{FP8_BLOCK}, {FP8_BLOCK}]"
            )

    def keeps_module(self, name: str) -> bool:
        """Whether module `name` (e.g. model.layers.0.linear_attn.in_proj_b) is listed bf16."""
        return name in {
            m.replace("model.language_model.", "model.", 1) for m in self.modules_to_not_convert
        }


@dataclass(frozen=True)
class ModelConfig:
    """A whole checkpoint's config: text model, optional vision tower and vision token ids."""

    model_type: str
    architecture: str
    text: TextConfig
    vision: VisionConfig | None = None
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    quantization: QuantizationConfig | None = None

    @property
    def max_position_embeddings(self) -> int:
        return self.text.max_position_embeddings

    @property
    def context_len(self) -> int:
        """Longest sequence (prompt + output) the model supports."""
        return self.text.max_position_embeddings


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults and stop ids from generation_config.json (fallbacks when absent).

    top_k 0 and top_p 1.0 disable those filters; temperature 0 is greedy (do_sample false).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"generation_config.temperature is {self.temperature}; must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"generation_config.top_p is {self.top_p}; must be in (0, 1]")
        if self.top_k < 0:
            raise ConfigError(f"generation_config.top_k is {self.top_k}; must be >= 0")


class JsonFields:
    """Typed reads from one JSON object; errors name the field by its path in the file."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where or 'config'} is {type(data).__name__}; expected an object")
        self.data = data
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, types: tuple[type, ...], default: Any = _MISSING) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise ConfigError(f"{self.path(key)} is missing: add it to config.json")
            return default
        if isinstance(value, bool) and bool not in types:
            raise ConfigError(f"{self.path(key)} is {value!r}; expected {types[0].__name__}")
        if not isinstance(value, types):
            raise ConfigError(
                f"{self.path(key)} is {value!r} ({type(value).__name__}); expected "
                + " or ".join(t.__name__ for t in types)
            )
        return value

    def int(self, key: str, default: Any = _MISSING) -> Any:
        return self.get(key, (int,), default)

    def float(self, key: str, default: Any = _MISSING) -> Any:
        value = self.get(key, (float, int), default)
        return value if value is None else float(value)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        return self.get(key, (bool,), default)

    def str(self, key: str, default: Any = _MISSING) -> Any:
        return self.get(key, (str,), default)

    def int_tuple(self, key: str, default: Any = _MISSING) -> Any:
        value = self.get(key, (int, list), default)
        if value is None:
            return ()
        items = [value] if isinstance(value, int) else value
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise ConfigError(f"{self.path(key)} is {value!r}; expected integers")
        return tuple(items)

    def require(self, key: str, allowed: tuple[Any, ...], default: Any) -> None:
        """Raise UnsupportedCheckpoint unless the field is absent or one of `allowed`."""
        value = self.data.get(key, default)
        if value not in allowed:
            raise UnsupportedCheckpoint(
                f"{self.path(key)} is {value!r}; sparkinfer supports only "
                + ", ".join(repr(a) for a in allowed)
            )


def _parse_rope(f: JsonFields) -> dict[str, Any]:
    """Rope fields of a text config: only plain (interleaved MRoPE) rope, no scaling."""
    if f.data.get("rope_scaling") is not None:
        raise UnsupportedCheckpoint(
            f"{f.path('rope_scaling')} is {f.data['rope_scaling']!r}; rope scaling is not "
            "supported: remove it (native context is max_position_embeddings)"
        )
    params = f.data.get("rope_parameters")
    r = JsonFields(params, f.path("rope_parameters")) if params is not None else f
    r.require("rope_type", ("default",), "default")
    r.require("mrope_interleaved", (True,), True)
    section = r.int_tuple("mrope_section", (11, 11, 10))
    if len(section) != 3:
        raise ConfigError(f"{r.path('mrope_section')} is {list(section)}; expected 3 integers")
    return {
        "rope_theta": r.float("rope_theta", 10_000.0 if params is None else _MISSING),
        "partial_rotary_factor": r.float("partial_rotary_factor", 0.25),
        "mrope_section": section,
    }


def _layer_types(f: JsonFields, num_layers: int) -> tuple[str, ...]:
    raw = f.get("layer_types", (list,), None)
    if raw is not None:
        return tuple(str(t) for t in raw)
    interval = f.int("full_attention_interval", 4)
    return tuple(
        FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)
    )


def parse_text_config(data: Mapping[str, Any], *, where: str = "text_config") -> TextConfig:
    """Parse a `qwen3_5_text` config object; `where` prefixes field names in errors."""
    f = JsonFields(data, where)
    f.require("model_type", ("qwen3_5_text",), "qwen3_5_text")
    f.require("hidden_act", ("silu",), "silu")
    f.require("attention_bias", (False,), False)
    f.require("attn_output_gate", (True,), True)
    f.require("output_gate_type", ("swish", "silu"), "swish")
    f.require("mlp_only_layers", ([],), [])
    f.require("num_experts", (None, 0), None)
    num_layers = f.int("num_hidden_layers")
    return TextConfig(
        vocab_size=f.int("vocab_size"),
        hidden_size=f.int("hidden_size"),
        intermediate_size=f.int("intermediate_size"),
        num_hidden_layers=num_layers,
        layer_types=_layer_types(f, num_layers),
        num_attention_heads=f.int("num_attention_heads"),
        num_key_value_heads=f.int("num_key_value_heads"),
        head_dim=f.int("head_dim"),
        linear_num_key_heads=f.int("linear_num_key_heads"),
        linear_num_value_heads=f.int("linear_num_value_heads"),
        linear_key_head_dim=f.int("linear_key_head_dim"),
        linear_value_head_dim=f.int("linear_value_head_dim"),
        linear_conv_kernel_dim=f.int("linear_conv_kernel_dim"),
        max_position_embeddings=f.int("max_position_embeddings"),
        rms_norm_eps=f.float("rms_norm_eps", 1e-6),
        tie_word_embeddings=f.bool("tie_word_embeddings", False),
        eos_token_ids=f.int_tuple("eos_token_id", ()),
        bos_token_id=f.int("bos_token_id", None),
        pad_token_id=f.int("pad_token_id", None),
        **_parse_rope(f),
    )


def parse_vision_config(data: Mapping[str, Any]) -> VisionConfig:
    """Parse `vision_config` (model_type qwen3_5_vision, or qwen3_5 as the shipped files say)."""
    f = JsonFields(data, "vision_config")
    f.require("model_type", ("qwen3_5_vision", "qwen3_5"), "qwen3_5_vision")
    rope = f.data.get("rope_parameters") or {}
    return VisionConfig(
        depth=f.int("depth"),
        hidden_size=f.int("hidden_size"),
        num_heads=f.int("num_heads"),
        intermediate_size=f.int("intermediate_size"),
        out_hidden_size=f.int("out_hidden_size"),
        hidden_act=f.str("hidden_act", "gelu_pytorch_tanh"),
        in_channels=f.int("in_channels", 3),
        patch_size=f.int("patch_size", 16),
        temporal_patch_size=f.int("temporal_patch_size", 2),
        spatial_merge_size=f.int("spatial_merge_size", 2),
        num_position_embeddings=f.int("num_position_embeddings", 2304),
        deepstack_visual_indexes=f.int_tuple("deepstack_visual_indexes", ()),
        rope_theta=JsonFields(rope, "vision_config.rope_parameters").float("rope_theta", 10_000.0),
    )


def parse_quantization_config(data: Mapping[str, Any] | None) -> QuantizationConfig | None:
    """`quantization_config` of config.json (None: absent); any other scheme or field raises
    UnsupportedCheckpoint naming it."""
    if data is None:
        return None
    f = JsonFields(data, "quantization_config")
    for key in data:
        if key not in _QUANTIZATION_FIELDS:
            raise UnsupportedCheckpoint(
                f"quantization_config.{key} is {data[key]!r}; sparkinfer reads only "
                f"{', '.join(_QUANTIZATION_FIELDS)} (Qwen's fine-grained FP8): remove it or "
                "serve a bf16 checkpoint"
            )
    block = f.int_tuple("weight_block_size")
    skipped = f.get("modules_to_not_convert", (list,), [])
    if not all(isinstance(m, str) for m in skipped):
        raise ConfigError("quantization_config.modules_to_not_convert must list module names")
    return QuantizationConfig(
        quant_method=f.str("quant_method"),
        fmt=f.str("fmt", "e4m3"),
        activation_scheme=f.str("activation_scheme", "dynamic"),
        weight_block_size=block,
        modules_to_not_convert=tuple(skipped),
    )


def _architecture(f: JsonFields, default: str) -> str:
    archs = f.get("architectures", (list,), [default])
    if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedCheckpoint(
            f"architectures is {archs!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return archs[0]


def parse_model_config(data: Mapping[str, Any]) -> ModelConfig:
    """Parse the contents of config.json into a `ModelConfig`."""
    f = JsonFields(data, "")
    model_type = f.str("model_type")
    if model_type == "qwen3_5_text":
        text = parse_text_config(data, where="")
        arch = _architecture(f, "Qwen3_5ForCausalLM")
        quantization = parse_quantization_config(f.get("quantization_config", (dict,), None))
        return ModelConfig(
            model_type=model_type, architecture=arch, text=text, quantization=quantization
        )
    if model_type != "qwen3_5":
        raise UnsupportedCheckpoint(
            f"model_type is {model_type!r}; sparkinfer supports 'qwen3_5' and 'qwen3_5_text' "
            "(Qwen3.5 / Qwen3.8 hybrid checkpoints)"
        )
    text_data = dict(f.get("text_config", (dict,)))
    if "tie_word_embeddings" in data:  # the top-level flag decides tying for the whole model
        text_data["tie_word_embeddings"] = data["tie_word_embeddings"]
    vision_data = f.get("vision_config", (dict,), None)
    return ModelConfig(
        model_type=model_type,
        architecture=_architecture(f, "Qwen3_5ForConditionalGeneration"),
        text=parse_text_config(text_data),
        vision=parse_vision_config(vision_data) if vision_data is not None else None,
        image_token_id=f.int("image_token_id", None),
        video_token_id=f.int("video_token_id", None),
        vision_start_token_id=f.int("vision_start_token_id", None),
        vision_end_token_id=f.int("vision_end_token_id", None),
        quantization=parse_quantization_config(f.get("quantization_config", (dict,), None)),
    )


def parse_generation_defaults(
    data: Mapping[str, Any] | None, *, config: ModelConfig
) -> GenerationDefaults:
    """Sampling defaults from generation_config.json contents (None: file absent)."""
    if data is None:
        return GenerationDefaults(eos_token_ids=config.text.eos_token_ids)
    f = JsonFields(data, "generation_config")
    eos = f.int_tuple("eos_token_id", None) or config.text.eos_token_ids
    is_sampling = f.bool("do_sample", True)
    return GenerationDefaults(
        temperature=f.float("temperature", 1.0) if is_sampling else 0.0,
        top_k=f.int("top_k", 0),
        top_p=f.float("top_p", 1.0),
        min_p=f.float("min_p", 0.0),
        repetition_penalty=f.float("repetition_penalty", 1.0),
        eos_token_ids=eos,
    )


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}): fix or re-download the file") from e


def load_model_config(checkpoint_dir: str | Path) -> ModelConfig:
    """Read and parse `<checkpoint_dir>/config.json`."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: a checkpoint directory needs a config.json")
    return parse_model_config(_read_json(path))


def load_generation_defaults(
    checkpoint_dir: str | Path, *, config: ModelConfig
) -> GenerationDefaults:
    """Read `<checkpoint_dir>/generation_config.json` if present, else fall back to the config."""
    path = Path(checkpoint_dir) / "generation_config.json"
    return parse_generation_defaults(_read_json(path) if path.is_file() else None, config=config)
