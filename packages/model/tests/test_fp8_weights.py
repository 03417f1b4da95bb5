"""FP8 weights: a Qwen-layout FP8 checkpoint (written here: 128x128 blocks with partial edge
blocks, the published key names and quantization_config) loads into FP8 layers whose logits equal
the dequantized model's; FP8 on load of the bf16 checkpoint gives the same model bit for bit;
quantization configs sparkinfer cannot serve are refused, naming the field; on whole-block shapes
our FP8 logits match transformers' own reading of the checkpoint (on the CPU to fp32 rounding; the
GPU kernels within transformers' bf16 noise)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from sparkinfer.kernels.fp8_linear import (
    BLOCK,
    CUBLAS_ROW_MULTIPLE,
    Fp8Activation,
    dequantize_weight_fp8,
    fp8_linear_ref,
    quantize_activation_fp8_ref,
    quantize_weight_fp8,
)
from sparkinfer.model.config import parse_quantization_config
from sparkinfer.model.errors import CheckpointError, UnsupportedCheckpoint
from sparkinfer.model.fp8_weights import QUANTIZED_ON_LOAD
from sparkinfer.model.weights import load_model, quantize_model_fp8

# hidden 200 = 128 + 72 (partial K and N blocks); every fused FP8 part a multiple of 128 rows
# (q 256 | k 128 | v 128, qkv 256 | z 128, gate 256 | up 256); in_proj_b/a: 4 rows each, bf16.
TEXT_FP8: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 200,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 4096,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [4, 2, 2],
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": False,
}
# Every FP8 projection whole 128x128 blocks, as in Qwen's releases (transformers' dequantizer
# takes only whole blocks): hidden 512 (4 K blocks, what cuBLAS's block-scaled GEMM takes);
# q 256 | k 128 | v 128, qkv 256 | z 128, o and out_proj 512x128, down 512x256.
TEXT_PUBLISHED: dict[str, Any] = {**TEXT_FP8, "hidden_size": 512}
VISION: dict[str, Any] = {
    "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
    "out_hidden_size": 200, "num_position_embeddings": 16,
}  # fmt: skip
WRAPPER = "model.language_model."
PROMPT = torch.tensor([3, 17, 250, 9, 1, 77, 140, 5, 8, 300, 2, 64])
# transformers' logits against ours: two prompts packed (79 rows: on the GPU cuBLAS where K has 4
# blocks, our prompt GEMM elsewhere), then DECODE_STEPS steps of both (2 rows: swap-AB); every
# route quantizes the activations per token and 128 columns
PROMPTS = (torch.arange(70) * 37 % 320, torch.tensor([5, 250, 17, 3, 99, 1, 64, 8, 300]))
DECODE_STEPS = 3
FP32_TOL = 1e-4  # max-abs error relative to max |transformers logit| (test_decoder.py)
# our FP8 kernels in bf16 against transformers fp32 with the checkpoint's dynamic activations:
# within this factor of transformers' own bf16 error (plus the slack), as test_decoder.py
FP8_NOISE_FACTOR = 1.5
FP8_SLACK = 0.01


def _quantized_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [n for n in tensors if QUANTIZED_ON_LOAD.match(n.replace(WRAPPER, "model.", 1))]


def _kept_modules(num_layers: int, layer_types: list[str]) -> list[str]:
    """modules_to_not_convert as Qwen's FP8 releases list them, for this layer schedule."""
    kept = ["lm_head"]
    for i, kind in enumerate(layer_types[:num_layers]):
        p = f"{WRAPPER}layers.{i}."
        kept += [p + "input_layernorm", p + "post_attention_layernorm"]
        if kind == "linear_attention":
            kept += [p + f"linear_attn.{m}" for m in ("A_log", "conv1d", "dt_bias", "in_proj_a",
                                                     "in_proj_b", "norm")]  # fmt: skip
        else:
            kept += [p + "self_attn.k_norm", p + "self_attn.q_norm"]
    return [*kept, "model.visual.blocks.0.attn.qkv", "model.visual.blocks.0.attn.proj"]


def _rewrite(src: Path, dst: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors*"):
        f.unlink()
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _write_checkpoints(root: Path, text: dict[str, Any]) -> dict[str, Path]:
    """bf16: a transformers checkpoint of `text`; fp8: its Qwen-layout FP8 export; dequantized:
    the FP8 export's values written back as fp32 weights (the reference)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    vision = {**VISION, "out_hidden_size": text["hidden_size"]}
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(0.0, 2.0)
            elif "norm" not in name:
                p.normal_(0.0, 0.05)
    bf16 = root / "bf16"
    model.to(torch.bfloat16).save_pretrained(bf16)
    tensors = {k: v.contiguous() for k, v in load_file(str(bf16 / "model.safetensors")).items()}
    config = json.loads((bf16 / "config.json").read_text())
    fp8, dequantized = dict(tensors), dict(tensors)
    for name in _quantized_names(tensors):
        q, scale = quantize_weight_fp8(tensors[name])
        fp8[name], fp8[name + "_scale_inv"] = q, scale
        dequantized[name] = dequantize_weight_fp8(q, scale)
    quant = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": _kept_modules(4, text["layer_types"]),
    }
    return {
        "bf16": bf16,
        "fp8": _rewrite(bf16, root / "fp8", fp8, {**config, "quantization_config": quant}),
        "dequantized": _rewrite(bf16, root / "dequantized", dequantized, config),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """TEXT_FP8's checkpoints (partial edge blocks)."""
    return _write_checkpoints(tmp_path_factory.mktemp("fp8"), TEXT_FP8)


def _logits(model, paged_runner) -> torch.Tensor:
    runner = paged_runner(model, max_lens=[len(PROMPT) + 1])
    (prefill,) = runner.step([(0, PROMPT)])
    (decode,) = runner.step([(0, torch.tensor([11]))])
    return torch.cat([prefill, decode])


def test_the_fp8_checkpoint_loads_into_fp8_layers(checkpoints):
    model = load_model(checkpoints["fp8"], device="cpu", dtype=torch.float32, progress=False)
    layer = model.model.layers[0]
    assert layer.linear_attn.in_proj.weight.dtype == torch.float8_e4m3fn
    assert layer.linear_attn.in_proj.weight.shape == (256 + 128, 200)
    assert layer.linear_attn.in_proj.weight_scale_inv.shape == (3, 2)  # 256/128 + 128/128 rows
    assert layer.linear_attn.in_proj.tail_weight.shape == (8, 200)  # in_proj_b | in_proj_a
    assert layer.mlp.down_proj.weight_scale_inv.shape == (2, 2)  # N = 200: a partial block
    attn = model.model.layers[3].self_attn
    assert attn.qkv_proj.weight.dtype == attn.o_proj.weight.dtype == torch.float8_e4m3fn
    assert model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert (
        model.visual is not None and model.visual.blocks[0].attn.qkv.weight.dtype == torch.float32
    )


def test_fp8_logits_equal_the_dequantized_model(checkpoints, paged_runner):
    kw = {"device": "cpu", "dtype": torch.float32, "progress": False}
    fp8 = _logits(load_model(checkpoints["fp8"], **kw), paged_runner)
    reference = _logits(load_model(checkpoints["dequantized"], **kw), paged_runner)
    torch.testing.assert_close(fp8, reference, atol=1e-5, rtol=1e-5)
    bf16 = _logits(load_model(checkpoints["bf16"], **kw), paged_runner)
    assert not torch.equal(fp8, bf16)  # the weights did change by quantization


def test_the_norms_hand_each_fp8_in_projection_its_input_quantized(checkpoints, paged_runner):
    """The input and post-attention norms quantize their output for GDN's in_proj, attention's
    qkv_proj and the MLP's gate_up_proj (K = hidden): quantize_activation_fp8's bits."""
    model = load_model(checkpoints["fp8"], device="cpu", dtype=torch.float32, progress=False)
    seen: list[tuple[int, bool]] = []

    def fp8_linear(x, weight, weight_scale_inv, *, x_fp8: Fp8Activation | None = None):
        if x_fp8 is not None:
            q, scale = quantize_activation_fp8_ref(x, CUBLAS_ROW_MULTIPLE)
            assert torch.equal(x_fp8.q.float(), q.float()) and torch.equal(x_fp8.scale, scale)
        seen.append((weight.shape[1], x_fp8 is not None))
        return fp8_linear_ref(x, weight, weight_scale_inv)

    model.use_ops(dataclasses.replace(model.ops, fp8_linear=fp8_linear))
    _logits(model, paged_runner)
    hidden = TEXT_FP8["hidden_size"]
    assert {k == hidden for k, _ in seen} == {True, False}  # in- and out-projections ran
    assert all(is_quantized == (k == hidden) for k, is_quantized in seen)


def test_fp8_on_load_equals_the_fp8_checkpoint(checkpoints, paged_runner):
    kw = {"device": "cpu", "dtype": torch.float32, "progress": False}
    on_load = load_model(checkpoints["bf16"], quantization="fp8", **kw)
    published = load_model(checkpoints["fp8"], **kw)
    for (name, a), (_, b) in zip(
        on_load.named_parameters(), published.named_parameters(), strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a.float(), b.float()), name
    assert torch.equal(_logits(on_load, paged_runner), _logits(published, paged_runner))


def _with_quantization(checkpoints, tmp_path, **changes) -> Path:
    dst = tmp_path / "changed"
    shutil.copytree(checkpoints["fp8"], dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"].update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"quant_method": "awq"}, "quantization_config.quant_method"),
        ({"fmt": "e5m2"}, "quantization_config.fmt"),
        ({"activation_scheme": "static"}, "quantization_config.activation_scheme"),
        ({"weight_block_size": [64, 64]}, "quantization_config.weight_block_size"),
        ({"scale_fmt": "ue8m0"}, "quantization_config.scale_fmt"),
    ],
)
def test_an_unsupported_quantization_config_is_refused(checkpoints, tmp_path, changes, field):
    path = _with_quantization(checkpoints, tmp_path, **changes)
    with pytest.raises(UnsupportedCheckpoint, match=field):
        load_model(path, device="cpu", dtype=torch.float32, progress=False)


def test_an_fp8_tensor_its_config_keeps_in_bf16_is_refused(checkpoints, tmp_path):
    listed = f"{WRAPPER}layers.0.mlp.down_proj"
    config = json.loads((checkpoints["fp8"] / "config.json").read_text())
    kept = [*config["quantization_config"]["modules_to_not_convert"], listed]
    path = _with_quantization(checkpoints, tmp_path, modules_to_not_convert=kept)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.down_proj\.weight is e4m3"):
        load_model(path, device="cpu", dtype=torch.float32, progress=False)


def test_the_published_quantization_config_parses():
    quant = parse_quantization_config(
        {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
         "weight_block_size": [128, 128],
         "modules_to_not_convert": [f"{WRAPPER}layers.0.linear_attn.in_proj_a"]}
    )  # fmt: skip
    assert quant is not None and quant.keeps_module("model.layers.0.linear_attn.in_proj_a")
    assert not quant.keeps_module("model.layers.0.linear_attn.in_proj_qkv")
    assert parse_quantization_config(None) is None


def test_quantizing_a_model_in_memory_equals_fp8_on_load(checkpoints):
    kw = {"device": "cpu", "dtype": torch.float32, "progress": False}
    in_memory = load_model(checkpoints["bf16"], **kw)
    quantize_model_fp8(in_memory)
    on_load = load_model(checkpoints["bf16"], quantization="fp8", **kw)
    for (name, a), (_, b) in zip(
        in_memory.named_parameters(), on_load.named_parameters(), strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a.float(), b.float()), name


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """TEXT_PUBLISHED's checkpoints (whole blocks, as transformers reads them)."""
    return _write_checkpoints(tmp_path_factory.mktemp("published"), TEXT_PUBLISHED)


def _sequences() -> list[torch.Tensor]:
    """Each prompt with its DECODE_STEPS teacher-forced tokens."""
    return [torch.cat([p, (p[:DECODE_STEPS] * 7 + 1) % 320]) for p in PROMPTS]


def _quantize_groups(x: torch.Tensor) -> torch.Tensor:
    """x as the checkpoint's dynamic scheme feeds an FP8 GEMM: e4m3 per token and 128 columns."""
    rows = x.reshape(-1, x.shape[-1])
    q, scale = quantize_activation_fp8_ref(rows)
    deq = q.float() * scale.repeat_interleave(BLOCK, dim=1)[:, : rows.shape[1]]
    return deq.to(x.dtype).reshape(x.shape)


@torch.no_grad()
def _transformers_logits(
    path: Path, dtype: torch.dtype, *, quantized_activations: bool
) -> list[torch.Tensor]:
    """transformers' logits over each of `_sequences()` (one forward each, fp32 out), the FP8
    checkpoint dequantized on load by transformers itself (what it does without a GPU; forced
    here so a GPU host reads it the same way). quantized_activations: the FP8 projections' inputs
    go through the checkpoint's dynamic 1x128 e4m3 scheme first, as our GPU kernels compute."""
    from transformers import FineGrainedFP8Config, Qwen3_5ForConditionalGeneration

    hf = Qwen3_5ForConditionalGeneration.from_pretrained(
        path, dtype=dtype, quantization_config=FineGrainedFP8Config(dequantize=True)
    ).eval()
    if quantized_activations:
        for name, module in hf.named_modules():
            if QUANTIZED_ON_LOAD.match(name.replace(WRAPPER, "model.", 1) + ".weight"):
                module.register_forward_pre_hook(lambda _, args: (_quantize_groups(args[0]),))
    return [hf(input_ids=ids[None]).logits[0].float() for ids in _sequences()]


def _our_logits(model, paged_runner) -> list[torch.Tensor]:
    """Both prompts in one prefill step, then DECODE_STEPS batched decode steps."""
    sequences = _sequences()
    runner = paged_runner(model, max_lens=[len(s) for s in sequences])
    rows = [[x] for x in runner.step([(i, p) for i, p in enumerate(PROMPTS)])]
    for t in range(DECODE_STEPS):
        step = runner.step([(i, s[len(p) + t : len(p) + t + 1]) for i, (s, p) in
                            enumerate(zip(sequences, PROMPTS, strict=True))])  # fmt: skip
        for i, logits in enumerate(step):
            rows[i].append(logits)
    return [torch.cat(r).float() for r in rows]


def test_transformers_reads_the_fp8_checkpoint_as_its_dequantized_weights(published):
    from transformers import FineGrainedFP8Config, Qwen3_5ForConditionalGeneration

    hf = Qwen3_5ForConditionalGeneration.from_pretrained(
        published["fp8"], dtype=torch.float32,
        quantization_config=FineGrainedFP8Config(dequantize=True),
    )  # fmt: skip
    stored = load_file(str(published["fp8"] / "model.safetensors"))
    for name, param in hf.named_parameters():
        if name + "_scale_inv" in stored:
            want = dequantize_weight_fp8(stored[name], stored[name + "_scale_inv"])
            assert torch.equal(param, want), name


def test_fp8_logits_match_transformers_on_the_published_layout(published, paged_runner):
    """On the CPU our FP8 layers run the dequantizing reference: transformers' fp32 logits on
    its own reading of the checkpoint, prompt rows and decode steps."""
    theirs = _transformers_logits(published["fp8"], torch.float32, quantized_activations=False)
    model = load_model(published["fp8"], device="cpu", dtype=torch.float32, progress=False)
    assert model.model.layers[3].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    for ours, ref in zip(_our_logits(model, paged_runner), theirs, strict=True):
        assert ((ours - ref).abs().max() / ref.abs().max()).item() <= FP32_TOL


@pytest.mark.gpu
def test_fp8_kernels_within_transformers_bf16_noise_on_gpu(published, paged_runner):
    """bf16 on the device, our FP8 kernels (see PROMPTS) against transformers fp32 with the
    dynamic activation scheme: within FP8_NOISE_FACTOR of transformers' own bf16 error
    (mean-abs, relative to mean |logit|)."""
    exact = _transformers_logits(published["fp8"], torch.float32, quantized_activations=True)
    hf16 = _transformers_logits(published["fp8"], torch.bfloat16, quantized_activations=True)
    model = load_model(published["fp8"], device="cuda", dtype=torch.bfloat16, progress=False)
    assert model.ops.is_triton
    for ours, theirs, ref in zip(_our_logits(model, paged_runner), hf16, exact, strict=True):
        noise = ((theirs - ref).abs().mean() / ref.abs().mean()).item()
        err = ((ours - ref).abs().mean() / ref.abs().mean()).item()
        assert err <= FP8_NOISE_FACTOR * noise + FP8_SLACK, (err, noise)


@pytest.mark.gpu
def test_the_norms_quantized_output_leaves_the_fp8_logits_bits_on_gpu(
    published, paged_runner, monkeypatch
):
    """The in-projections reading x as their norm quantized it give the logits of quantizing x
    in the GEMMs, bit for bit (prompt rows and decode steps)."""
    from sparkinfer.model.layers.norm import RMSNorm

    model = load_model(published["fp8"], device="cuda", dtype=torch.bfloat16, progress=False)
    fused = _our_logits(model, paged_runner)
    monkeypatch.setattr(RMSNorm, "forward_for", lambda self, linear, x, r=None: (*self(x, r), None))
    for a, b in zip(fused, _our_logits(model, paged_runner), strict=True):
        assert torch.equal(a, b)
