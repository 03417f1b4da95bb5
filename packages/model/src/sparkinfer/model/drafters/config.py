"""A block drafter's config.json -> frozen `DrafterConfig`, checked against the target's config.

Three published layouts (docs/model.md §17), told apart by `architectures`:

| layout | architectures | extras |
|---|---|---|
| `dflash` | `DFlashDraftModel` | none |
| `dflash2` | `DFlash2DraftModel` | in-block convolution, candidate selector |
| `dspark` | `DSparkDraftModel`, `Qwen3DSparkModel`, `Qwen3_8DSparkModel` | Markov, confidence |

Drafter fields live at the top level or under `dflash_config` (z-lab and RadixArk put
`block_size`, `mask_token_id` and `target_layer_ids` in either place); `dflash_config` wins.
Anything that does not fit the target, or that sparkinfer does not implement, is an error of one
line naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkinfer.model.config import JsonFields, TextConfig
from sparkinfer.model.errors import ConfigError, UnsupportedCheckpoint

DFLASH, DFLASH2, DSPARK = "dflash", "dflash2", "dspark"
LAYOUTS = {
    "DFlashDraftModel": DFLASH,
    "DFlash2DraftModel": DFLASH2,
    "DSparkDraftModel": DSPARK,
    "Qwen3DSparkModel": DSPARK,
    "Qwen3_8DSparkModel": DSPARK,
}
MAX_DRAFTS = 15  # the verify path takes a block of at most 16 rows: the anchor and 15 drafts
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class DrafterConfig:
    """A block drafter's shapes and how it proposes; see the module docstring for the layouts.

    sliding_windows: per drafter layer, the window (a key is seen while q_pos - k_pos < window)
    or None for full attention. is_causal: whether a block row also sees later rows (False in
    every published drafter). The DFlash2 and DSpark fields are zero or False elsewhere.
    """

    layout: str
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    sliding_windows: tuple[int | None, ...]
    num_target_layers: int | None = None  # the target depth it was trained on, when stated
    target_hidden_size: int | None = None  # the target width (DSpark's field), when stated
    is_causal: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    conv_kernel_size: int = 0
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0
    markov_rank: int = 0
    has_confidence_head: bool = False
    confidence_with_markov: bool = False

    def __post_init__(self) -> None:
        if self.layout not in (DFLASH, DFLASH2, DSPARK):
            raise ConfigError(f"layout is {self.layout!r}; expected dflash, dflash2 or dspark")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}: fix the drafter's config.json"
            )
        if len(self.sliding_windows) != self.num_hidden_layers:
            raise ConfigError(
                f"layer_types has {len(self.sliding_windows)} entries; the drafter has "
                f"num_hidden_layers = {self.num_hidden_layers}"
            )
        if not 1 <= self.num_drafts <= MAX_DRAFTS:
            raise UnsupportedCheckpoint(
                f"block_size {self.block_size} gives {self.num_drafts} drafts a step; sparkinfer "
                f"verifies 1 to {MAX_DRAFTS}"
            )
        if self.layout == DFLASH2 and self.hidden_size % max(self.conv_group_size, 1):
            raise ConfigError(
                f"dflash_config.conv_group_size {self.conv_group_size} does not divide "
                f"hidden_size {self.hidden_size}"
            )

    @property
    def is_shifted(self) -> bool:
        """Whether block row j predicts the token after it (DSpark) rather than its own token
        (DFlash: row 0 holds the anchor, rows 1.. are masks that predict themselves)."""
        return self.layout == DSPARK

    @property
    def num_drafts(self) -> int:
        """Draft tokens one block proposes: block_size (DSpark) or block_size - 1 (DFlash)."""
        return self.block_size if self.is_shifted else self.block_size - 1

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)


def _drafter_fields(data: Mapping[str, Any]) -> tuple[JsonFields, JsonFields]:
    """(top level, the values of dflash_config over the top level)."""
    top = JsonFields(data, "")
    nested = top.get("dflash_config", (dict,), {})
    return top, JsonFields({**data, **nested}, "")


def _rope_theta(top: JsonFields) -> float:
    rope = top.get("rope_parameters", (dict,), None) or top.get("rope_scaling", (dict,), None)
    if rope is None:
        return top.float("rope_theta", 1_000_000.0)
    r = JsonFields(rope, "rope_parameters")
    r.require("rope_type", ("default",), "default")
    return r.float("rope_theta", top.float("rope_theta", 1_000_000.0))


def _sliding_windows(top: JsonFields, num_layers: int) -> tuple[int | None, ...]:
    types = top.get("layer_types", (list,), [FULL] * num_layers)
    unknown = [t for t in types if t not in (SLIDING, FULL)]
    if unknown:
        raise UnsupportedCheckpoint(
            f"layer_types holds {unknown[0]!r}; expected {SLIDING} or {FULL}"
        )
    window = top.int("sliding_window", None) if SLIDING in types else None
    if SLIDING in types and (window is None or window < 1):
        raise ConfigError("layer_types has sliding_attention layers but sliding_window is unset")
    return tuple(window if t == SLIDING else None for t in types)


def _layout_fields(layout: str, f: JsonFields) -> dict[str, Any]:
    """The DFlash2 or DSpark extras."""
    if layout == DFLASH2:
        return {
            "conv_kernel_size": f.int("conv_kernel_size"),
            "conv_group_size": f.int("conv_group_size"),
            "selector_rank": f.int("selector_rank"),
            "selector_top_k": f.int("selector_top_k"),
        }
    if layout != DSPARK:
        return {}
    markov_rank = f.int("markov_rank", 0)
    if markov_rank:
        f.require("markov_head_type", ("vanilla",), "vanilla")
    if f.bool("dspark_backbone_conv_enabled", False):
        raise UnsupportedCheckpoint(
            "dflash_config.dspark_backbone_conv_enabled is true; sparkinfer runs DSpark drafters "
            "without the backbone convolution only"
        )
    has_confidence = f.bool("enable_confidence_head", False)
    return {
        "markov_rank": markov_rank,
        "has_confidence_head": has_confidence,
        "confidence_with_markov": has_confidence and f.bool("confidence_head_with_markov", False),
    }


def parse_drafter_config(data: Mapping[str, Any]) -> DrafterConfig:
    """The contents of a drafter's config.json -> `DrafterConfig` (not yet checked against a
    target: `check_drafter_fits`)."""
    top, f = _drafter_fields(data)
    archs = top.get("architectures", (list,))
    if len(archs) != 1 or archs[0] not in LAYOUTS:
        raise UnsupportedCheckpoint(
            f"the drafter's architectures is {archs!r}; supported block drafters: "
            + ", ".join(LAYOUTS)
        )
    layout = LAYOUTS[archs[0]]
    top.require("attention_bias", (False,), False)
    top.require("hidden_act", ("silu",), "silu")
    vocab = top.int("vocab_size")
    if top.int("draft_vocab_size", vocab) != vocab:
        raise UnsupportedCheckpoint(
            "draft_vocab_size differs from vocab_size; sparkinfer runs drafters over the "
            "target's whole vocabulary only"
        )
    hidden, heads = top.int("hidden_size"), top.int("num_attention_heads")
    num_layers = top.int("num_hidden_layers")
    softcap = f.float("final_logit_softcapping", None)
    return DrafterConfig(
        layout=layout,
        architecture=archs[0],
        hidden_size=hidden,
        intermediate_size=top.int("intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=top.int("num_key_value_heads", heads),
        head_dim=top.int("head_dim", hidden // heads),
        rms_norm_eps=top.float("rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(top),
        vocab_size=vocab,
        block_size=f.int("block_size", 7 if layout == DSPARK else 16),
        mask_token_id=f.int("mask_token_id"),
        target_layer_ids=f.int_tuple("target_layer_ids"),
        sliding_windows=_sliding_windows(top, num_layers),
        num_target_layers=f.int("num_target_layers", None),
        target_hidden_size=f.int("target_hidden_size", None),
        is_causal=f.bool("is_causal", f.bool("causal", False)),
        input_embedding_scale=f.float("input_embedding_scale", 1.0),
        output_multiplier=f.float("output_multiplier", 1.0),
        final_logit_softcapping=softcap if softcap else None,
        **_layout_fields(layout, f),
    )


def check_drafter_fits(config: DrafterConfig, target: TextConfig) -> None:
    """Raise ConfigError naming the first drafter field that does not fit the target model."""
    num_layers, hidden = target.num_hidden_layers, target.hidden_size
    checks = [
        ("hidden_size", config.hidden_size, hidden),
        ("vocab_size", config.vocab_size, target.vocab_size),
        ("num_target_layers", config.num_target_layers or num_layers, num_layers),
        ("target_hidden_size", config.target_hidden_size or hidden, hidden),
    ]
    for name, got, want in checks:
        if got != want:
            raise ConfigError(
                f"the drafter's {name} is {got}; the target model's is {want}: this drafter was "
                "trained for another model"
            )
    lowest = -1 if config.layout == DSPARK else 0
    ids = config.target_layer_ids
    bad = [i for i in ids if not lowest <= i < num_layers]
    if not ids or bad or len(set(ids)) != len(ids):
        raise ConfigError(
            f"the drafter's target_layer_ids {list(ids)} must be distinct and in "
            f"[{lowest}, {num_layers - 1}]: the target model has {num_layers} layers"
        )
    if not 0 <= config.mask_token_id < target.vocab_size:
        raise ConfigError(
            f"the drafter's mask_token_id {config.mask_token_id} is outside the target's "
            f"vocabulary of {target.vocab_size} ids"
        )


def load_drafter_config(drafter_dir: str | Path, target: TextConfig) -> DrafterConfig:
    """Read `<drafter_dir>/config.json`, parse it and check it against the target."""
    path = Path(drafter_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: a drafter directory needs a config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}): fix or re-download it") from e
    config = parse_drafter_config(data)
    check_drafter_fits(config, target)
    return config
