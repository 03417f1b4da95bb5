"""Checkpoint files (local directory or hub id) -> a loaded `Qwen3_8ForCausalLM`.

Accepted tensor layouts (docs/model.md §11):
- Qwen3_5ForConditionalGeneration: `model.language_model.*`, `lm_head.weight`, `model.visual.*`,
  `mtp.*`
- Qwen3_5ForCausalLM: `model.*`, `lm_head.weight`

The one rename is `model.language_model.X` -> `model.X`. Vision (`model.visual.*`) and MTP
(`mtp.*`) tensors are recognised and kept apart in `Checkpoint.vision` / `Checkpoint.mtp`;
`load_model` loads the vision group into the model's tower (`visual`, built when config.json has a
`vision_config` and the checkpoint has its tensors). Any other unknown or missing tensor is an
error naming it. Each tensor's dtype comes from the safetensors header;
`copy_` casts it to the parameter's dtype (A_log and dt_bias parameters are fp32).

Fused parameters: a few projections that read the same input are one parameter here, so each
runs as one GEMM; the checkpoint keeps their parts under their own names and each part fills a
block of rows, in this order (`fused_parameters`, below `model.layers.N.`; `.weight` omitted):

| parameter | checkpoint tensors, in row order |
|---|---|
| `linear_attn.in_proj` | `linear_attn.in_proj_{qkv,z,b,a}` |
| `self_attn.qkv_proj` | `self_attn.q_proj`, `self_attn.k_proj`, `self_attn.v_proj` |
| `mlp.gate_up_proj` | `mlp.gate_proj`, `mlp.up_proj` |

`checkpoint_views` maps every text tensor name to the parameter, or rows of one, that it fills;
names, shapes and errors are all in checkpoint names.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import safe_open
from sparkinfer.model import fp8_weights
from sparkinfer.model.config import (
    GenerationDefaults,
    ModelConfig,
    TextConfig,
    load_generation_defaults,
    load_model_config,
)
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.errors import CheckpointError, CheckpointNotFound
from tqdm.auto import tqdm

MULTIMODAL_TEXT_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
VISION_PREFIX = "model.visual."
MTP_PREFIX = "mtp."
LM_HEAD = "lm_head.weight"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_PATTERNS = ("*.json", "*.jinja")
CHECKPOINT_PATTERNS = ("*.json", "*.jinja", "*.safetensors", "*.txt", "*.tiktoken")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_MAX_NAMES = 8  # tensor names quoted in one error message
_VISION_MODULE = "visual."  # the tower's parameters inside Qwen3_8ForCausalLM
_LAYER_PARAMETER = re.compile(r"^(model\.layers\.\d+\.)(.+)$")  # (layer prefix, name in layer)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorRef:
    """Where one checkpoint tensor lives and what its header says."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class FusedPart:
    """One checkpoint tensor of a fused parameter: its name below `model.layers.N.`, its rows."""

    name: str
    num_rows: int


def fused_parameters(text: TextConfig) -> dict[str, tuple[FusedPart, ...]]:
    """The fused-parameter table: parameter below `model.layers.N.` -> its parts in row order."""
    q_rows = 2 * text.num_attention_heads * text.head_dim  # queries and their output gates
    kv_rows = text.num_key_value_heads * text.head_dim
    num_v_heads, intermediate = text.linear_num_value_heads, text.intermediate_size
    return {
        "linear_attn.in_proj.weight": (
            FusedPart("linear_attn.in_proj_qkv.weight", text.linear_conv_dim),
            FusedPart("linear_attn.in_proj_z.weight", text.linear_value_dim),
            FusedPart("linear_attn.in_proj_b.weight", num_v_heads),
            FusedPart("linear_attn.in_proj_a.weight", num_v_heads),
        ),
        "self_attn.qkv_proj.weight": (
            FusedPart("self_attn.q_proj.weight", q_rows),
            FusedPart("self_attn.k_proj.weight", kv_rows),
            FusedPart("self_attn.v_proj.weight", kv_rows),
        ),
        "mlp.gate_up_proj.weight": (
            FusedPart("mlp.gate_proj.weight", intermediate),
            FusedPart("mlp.up_proj.weight", intermediate),
        ),
    }


@dataclass(frozen=True)
class CheckpointConfigs:
    """A checkpoint's local directory and its parsed configs."""

    path: Path
    model: ModelConfig
    generation: GenerationDefaults


@dataclass(frozen=True)
class Checkpoint:
    """An opened checkpoint: configs plus its tensors grouped by owner (nothing read yet).

    text: keyed by text tensor name (`model.language_model.*` renamed to `model.*`), the keys of
    `checkpoint_views`; vision and mtp: keyed by checkpoint name.
    """

    path: Path
    config: ModelConfig
    generation: GenerationDefaults
    text: Mapping[str, TensorRef]
    vision: Mapping[str, TensorRef]
    mtp: Mapping[str, TensorRef]

    def read(
        self, refs: Mapping[str, TensorRef], *, progress: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (key, CPU tensor in its stored dtype) for `refs`, one file open at a time."""
        by_file: dict[Path, list[tuple[str, TensorRef]]] = {}
        for key, ref in refs.items():
            by_file.setdefault(ref.file, []).append((key, ref))
        bar = tqdm(total=len(refs), desc="Loading weights", unit="tensor", disable=not progress)
        with bar:
            for file, items in by_file.items():
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for key, ref in items:
                        yield key, f.get_tensor(ref.name)
                        bar.update(1)

    def read_group(self, group: str, *, device: torch.device | str) -> dict[str, torch.Tensor]:
        """All tensors of group "vision" or "mtp" by checkpoint name, on `device`, stored dtype."""
        refs = {"vision": self.vision, "mtp": self.mtp}.get(group)
        if refs is None:
            raise ValueError(f"group is {group!r}; expected 'vision' or 'mtp'")
        return {k: t.to(device) for k, t in self.read(refs)}


class _SilentTqdm(tqdm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def resolve_checkpoint(
    path_or_id: str | Path, *, allow_patterns: Sequence[str], progress: bool = True
) -> Path:
    """A local checkpoint directory, downloading `allow_patterns` of a hub repo id if needed."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointNotFound(f"{path} is a file; pass the checkpoint directory that holds it")
    text = str(path_or_id)
    if not _REPO_ID.match(text):
        raise CheckpointNotFound(
            f"{text} is neither an existing directory nor a hub repo id (owner/name): "
            "check the path"
        )
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

    try:
        local = huggingface_hub.snapshot_download(
            text,
            allow_patterns=list(allow_patterns),
            tqdm_class=None if progress else _SilentTqdm,
        )
    except (HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OSError) as e:
        raise CheckpointNotFound(
            f"cannot fetch {text!r} from the Hugging Face hub ({type(e).__name__}: {e}); fetch "
            f"it with `python -m sparkinfer.model.hub {text}` where the hub is reachable (a "
            "private repo also needs HF_TOKEN), or download it elsewhere and pass its local "
            "directory path instead"
        ) from e
    return Path(str(local))


def read_checkpoint_configs(path_or_id: str | Path, *, progress: bool = True) -> CheckpointConfigs:
    """Config and generation defaults of a directory or hub id (fetches only the small files).

    The returned `path` of a hub id holds no weights: load the model from the id itself, or from
    `hub.fetch_checkpoint(id)`, which fetches the whole checkpoint.
    """
    path = resolve_checkpoint(path_or_id, allow_patterns=CONFIG_PATTERNS, progress=progress)
    model = load_model_config(path)
    return CheckpointConfigs(path, model, load_generation_defaults(path, config=model))


def _shard_files(path: Path) -> dict[str, Path]:
    """Tensor name -> file, from the index if sharded, else from the single file's header."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} has no valid weight_map ({e}): re-download it") from e
        files = {name: path / file for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise CheckpointError(f"{index} lists {file.name}, which is missing: re-download")
        return files
    single = path / SINGLE_FILE
    if not single.is_file():
        raise CheckpointNotFound(
            f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}: pass a safetensors checkpoint"
        )
    with safe_open(str(single), framework="pt", device="cpu") as f:
        return dict.fromkeys(f.keys(), single)


def _read_headers(files: Mapping[str, Path]) -> list[TensorRef]:
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    refs = []
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt", device="cpu") as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(
                        f"tensor {name} is listed for {file.name} in {INDEX_FILE} but that file "
                        "does not hold it: the index and the shards disagree; re-download them"
                    )
                info = f.get_slice(name)
                refs.append(TensorRef(file, name, info.get_dtype(), tuple(info.get_shape())))
    return refs


def read_tensor_refs(path: Path) -> list[TensorRef]:
    """Every tensor of the safetensors checkpoint in directory `path` (headers only)."""
    return _read_headers(_shard_files(path))


def _quote(names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:_MAX_NAMES])
    more = len(names) - _MAX_NAMES
    return shown + (f" and {more} more" if more > 0 else "")


def _group(refs: Sequence[TensorRef]) -> tuple[dict[str, TensorRef], ...]:
    """Split tensors into text (renamed to parameter names), vision and mtp."""
    text: dict[str, TensorRef] = {}
    vision: dict[str, TensorRef] = {}
    mtp: dict[str, TensorRef] = {}
    unknown = []
    for ref in refs:
        name = ref.name
        if name.startswith(MTP_PREFIX):
            mtp[name] = ref
        elif name.startswith(VISION_PREFIX):
            vision[name] = ref
        elif name == LM_HEAD or name.startswith(TEXT_PREFIX):
            if name.startswith(MULTIMODAL_TEXT_PREFIX):
                name = TEXT_PREFIX + name.removeprefix(MULTIMODAL_TEXT_PREFIX)
            if name in text:
                raise CheckpointError(
                    f"tensor {name} appears twice ({text[name].name} and {ref.name}): "
                    "the checkpoint mixes both layouts"
                )
            text[name] = ref
        else:
            unknown.append(name)
    if unknown:
        raise CheckpointError(
            f"unexpected tensors {_quote(unknown)}: they belong to no known part of a Qwen3.5 "
            "checkpoint (text model, model.visual, mtp); check the checkpoint"
        )
    return text, vision, mtp


def open_checkpoint(path_or_id: str | Path, *, progress: bool = True) -> Checkpoint:
    """Resolve, parse the configs, and index every tensor by owner (reads headers only)."""
    path = resolve_checkpoint(path_or_id, allow_patterns=CHECKPOINT_PATTERNS, progress=progress)
    config = load_model_config(path)
    generation = load_generation_defaults(path, config=config)
    text, vision, mtp = _group(_read_headers(_shard_files(path)))
    return Checkpoint(path, config, generation, text, vision, mtp)


def _text_parameters(model: Qwen3_8ForCausalLM) -> dict[str, torch.nn.Parameter]:
    return {
        n: p
        for n, p in model.named_parameters()
        if not n.startswith((_VISION_MODULE, MTP_PREFIX))  # loaded from their own groups
    }


def checkpoint_views(model: Qwen3_8ForCausalLM) -> dict[str, torch.Tensor]:
    """Text tensor name -> the parameter, or the rows of a fused parameter, that the tensor fills.

    In the model's parameter order, with each fused parameter's parts in row order; the views of a
    fused parameter tile its rows exactly once.
    """
    fused = fused_parameters(model.config.text)
    fp8 = fp8_weights.fp8_views_by_parameter(model, model.config.text, fused)
    views: dict[str, torch.Tensor] = {}
    for name, param in _text_parameters(model).items():
        if name in fp8:  # an FP8 layer: e4m3 rows, their scales, bf16 tail rows
            views.update(fp8[name])
            continue
        match = _LAYER_PARAMETER.match(name)
        parts = fused.get(match[2]) if match else None
        if match is None or parts is None:
            views[name] = param
            continue
        num_rows = [part.num_rows for part in parts]
        assert sum(num_rows) == param.shape[0], f"{name}: the fused table disagrees with its layer"
        for part, rows in zip(parts, param.split(num_rows), strict=True):
            views[match[1] + part.name] = rows
    return views


def _match_tensors(views: Mapping[str, torch.Tensor], ckpt: Checkpoint) -> dict[str, TensorRef]:
    """Check names and shapes of the text tensors against the views they fill."""
    refs = dict(ckpt.text)
    if ckpt.config.text.tie_word_embeddings:
        refs.pop(LM_HEAD, None)  # tied: the head is embed_tokens, a stored copy is redundant
    missing = sorted(set(views) - set(refs))
    unexpected = sorted(set(refs) - set(views))
    if missing:
        raise CheckpointError(
            f"missing tensors {_quote(missing)} (names after mapping model.language_model.* to "
            f"model.*) in {ckpt.path}: the checkpoint does not match its config.json"
        )
    if unexpected:
        names = [refs[n].name for n in unexpected]
        raise CheckpointError(
            f"unexpected tensors {_quote(names)} in {ckpt.path}: the config.json does not "
            "declare them; check num_hidden_layers and layer_types"
        )
    for name, ref in refs.items():
        expected = tuple(views[name].shape)
        if ref.shape != expected:
            raise CheckpointError(
                f"tensor {ref.name} has shape {list(ref.shape)}; the config expects "
                f"{list(expected)}: the checkpoint does not match its config.json"
            )
    return refs


@torch.no_grad()
def load_text_weights(
    model: Qwen3_8ForCausalLM,
    ckpt: Checkpoint,
    *,
    progress: bool = True,
    quantize_on_load: bool = False,
) -> None:
    """Copy every text tensor of `ckpt` into its (rows of a) parameter; names and shapes first.

    The layers whose checkpoint tensors are FP8 become FP8 layers first (fp8_weights.py); with
    quantize_on_load the bf16 projections Qwen's FP8 releases quantize are quantized here.
    """
    quant = ckpt.config.quantization
    quantize = fp8_weights.use_fp8_layers(
        model,
        model.config.text,
        fused_parameters(model.config.text),
        ckpt.text,
        keeps=quant.keeps_module if quant is not None else lambda _: False,
        on_load=quantize_on_load and quant is None,
    )
    views = checkpoint_views(model)
    scales = {fp8_weights.scale_name(n) for n in quantize}  # made here, not stored
    stored = {n: v for n, v in views.items() if n not in scales}
    device = model.lm_head.weight.device
    for name, tensor in ckpt.read(_match_tensors(stored, ckpt), progress=progress):
        converted = (
            fp8_weights.quantized_on_load(name, tensor, device)
            if name in quantize
            else [(name, tensor)]
        )
        for key, value in converted:
            views[key].copy_(value)


@torch.no_grad()
def quantize_model_fp8(model: Qwen3_8ForCausalLM) -> None:
    """FP8 on load for a model already in memory (random weights, benchmarks): the same layers,
    blocks and values as `load_model(..., quantization="fp8")` of its checkpoint."""
    text = model.config.text
    before = checkpoint_views(model)  # keeps the bf16 storage alive until copied
    quantize = fp8_weights.use_fp8_layers(
        model, text, fused_parameters(text), {}, keeps=lambda _: False, on_load=True
    )
    device = model.lm_head.weight.device
    after = checkpoint_views(model)
    for name, view in after.items():
        if name in quantize:
            for key, value in fp8_weights.quantized_on_load(name, before[name], device):
                after[key].copy_(value)
        elif name in before and view.data_ptr() != before[name].data_ptr():
            view.copy_(before[name])  # the bf16 tail rows of an FP8 layer


def load_model(
    path_or_id: str | Path,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    progress: bool = True,
    num_real_tokens: int | None = None,
    use_mtp: bool | Literal["auto"] = False,
    quantization: str | None = None,
) -> Qwen3_8ForCausalLM:
    """Load the model of a local checkpoint directory or hub repo id.

    The vision tower (`model.visual`) is built and loaded when config.json has a `vision_config`
    and the checkpoint holds `model.visual.*` tensors; a vision_config without them gives a
    text-only model (logged).
    num_real_tokens: the tokenizer's length when known; ids at or above it get -inf logits.
    use_mtp: also build the MTP head (`model.mtp`, speculative decoding's drafter) from the
        checkpoint's `mtp.*` tensors; raises CheckpointError when it has none. "auto": build it
        when the checkpoint has them (speculative "auto").
    quantization: "fp8" quantizes a bf16 checkpoint's decoder projections on load (the layout
        of Qwen's FP8 releases, fp8_weights.py); None serves the checkpoint as stored (an FP8
        checkpoint runs in FP8 either way).
    """
    if quantization not in (None, "fp8"):
        raise ValueError(f"quantization is {quantization!r}; expected None or 'fp8'")
    ckpt = open_checkpoint(path_or_id, progress=progress)
    has_vision = ckpt.config.vision is not None
    if has_vision and not ckpt.vision:
        logger.warning(
            "%s has a vision_config but no model.visual.* tensors: serving text only",
            ckpt.path,
        )
    model = Qwen3_8ForCausalLM(
        ckpt.config,
        device=device,
        dtype=dtype,
        num_real_tokens=num_real_tokens,
        use_vision=has_vision and bool(ckpt.vision),
    )
    load_text_weights(model, ckpt, progress=progress, quantize_on_load=quantization == "fp8")
    if model.visual is not None:
        vision = fp8_weights.dequantize_group(dict(ckpt.read(ckpt.vision, progress=progress)))
        model.visual.load_weights(iter(vision.items()))
    if use_mtp == "auto":
        use_mtp = bool(ckpt.mtp)
    if use_mtp:
        if not ckpt.mtp:
            raise CheckpointError(
                f"{ckpt.path} has no mtp.* tensors: the MTP drafter needs them; serve it with "
                "speculative ngram or off"
            )
        mtp = dict(ckpt.read(ckpt.mtp, progress=progress))
        model.attach_mtp(fp8_weights.dequantize_group(mtp))
    return model
