"""Qwen3_8ForCausalLM against transformers' Qwen3_5ForCausalLM / Qwen3_5ForConditionalGeneration.

Checkpoints are small random ones written by `save_pretrained` and loaded through weights.py.
Prompts sit on both sides of the 64-token chunk and 16-token block boundaries and past 2,048.
fp32: the max-abs error relative to the logit scale (max |HF logit|) is <= 1e-4.
bf16: these random models amplify rounding noise (transformers' own bf16 logits are ~8% off its
fp32 ones in mean-abs terms), so the bf16 check is relative to that noise: our bf16 error against
transformers fp32 must stay within BF16_NOISE_FACTOR x transformers' bf16 error against its fp32
(mean-abs, relative to mean |logit|) + BF16_SLACK.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.layers.rotary import RotaryEmbedding
from sparkinfer.model.weights import load_model

LENGTHS = (1, 63, 64, 65, 500, 2100)
NUM_DECODE = 16
FP32_TOL = 1e-4
# Triton's fp32 tl.dot runs in tf32 on tensor cores (10-bit mantissa): the CUDA model gets a
# looser fp32 bound than the reference ops on CPU.
CUDA_FP32_TOL = 3e-3
BF16_NOISE_FACTOR = 1.5
BF16_SLACK = 0.01


@dataclass
class Reference:
    """transformers' logits for one prompt and teacher-forced decode tokens."""

    prompt: torch.Tensor  # [L]
    decode_ids: torch.Tensor  # [NUM_DECODE]
    prefill: torch.Tensor  # [L, V] fp32
    decode: torch.Tensor  # [NUM_DECODE, V] fp32


VOCAB = 320  # conftest's checkpoints


def _tokens(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_reference(ckpt: Path, *, conditional: bool, dtype: torch.dtype, lengths) -> list[Reference]:
    """Prefill each prompt alone in transformers, then decode with its cache object."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    cls = Qwen3_5ForConditionalGeneration if conditional else Qwen3_5ForCausalLM
    hf = cls.from_pretrained(ckpt, dtype=dtype).eval()
    # transformers 5.2x calls the cache `cache`; earlier 5.x releases `past_key_values`.
    cache_arg = (
        "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    )
    refs = []
    for length in lengths:
        prompt, decode_ids = _tokens(length, seed=length), _tokens(NUM_DECODE, seed=-length)
        out = hf(input_ids=prompt[None], use_cache=True)
        cache, steps = getattr(out, cache_arg), []
        for tok in decode_ids:
            step = hf(input_ids=tok.view(1, 1), use_cache=True, **{cache_arg: cache})
            cache = getattr(step, cache_arg)
            steps.append(step.logits[0, -1].float())
        refs.append(Reference(prompt, decode_ids, out.logits[0].float(), torch.stack(steps)))
    return refs


def _rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def _mean_rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().mean() / ref.abs().mean()).item()


def run_packed(model: Qwen3_8ForCausalLM, refs: list[Reference], runner_cls) -> tuple[list, list]:
    """All prompts in one packed prefill step, then NUM_DECODE batched decode steps."""
    runner = runner_cls(model, max_lens=[len(r.prompt) + NUM_DECODE for r in refs])
    prefill = runner.step([(i, r.prompt) for i, r in enumerate(refs)])
    decode = [[] for _ in refs]
    for t in range(NUM_DECODE):
        out = runner.step([(i, r.decode_ids[t : t + 1]) for i, r in enumerate(refs)])
        for i, logits in enumerate(out):
            decode[i].append(logits[0])
    return prefill, [torch.stack(d) for d in decode]


def check_against(
    refs: list[Reference], model: Qwen3_8ForCausalLM, runner_cls, tol: float = FP32_TOL
) -> None:
    prefill, decode = run_packed(model, refs, runner_cls)
    for ref, ours_prefill, ours_decode in zip(refs, prefill, decode, strict=True):
        length = len(ref.prompt)
        assert _rel_err(ours_prefill, ref.prefill) <= tol, f"prefill, prompt of {length}"
        assert _rel_err(ours_decode, ref.decode) <= tol, f"decode after prompt of {length}"


@pytest.fixture(scope="module")
def causal_refs(causal_ckpt: Path) -> list[Reference]:
    return hf_reference(causal_ckpt, conditional=False, dtype=torch.float32, lengths=LENGTHS)


@pytest.fixture(scope="module")
def causal_model(causal_ckpt: Path) -> Qwen3_8ForCausalLM:
    return load_model(causal_ckpt, device="cpu", dtype=torch.float32, progress=False)


def test_causal_lm_matches_transformers_fp32(causal_refs, causal_model, paged_runner) -> None:
    check_against(causal_refs, causal_model, paged_runner)


@pytest.fixture(scope="module")
def conditional_refs(conditional_ckpt: Path) -> list[Reference]:
    return hf_reference(conditional_ckpt, conditional=True, dtype=torch.float32, lengths=LENGTHS)


def test_conditional_generation_matches_transformers_fp32(
    conditional_ckpt, conditional_refs, paged_runner
) -> None:
    model = load_model(conditional_ckpt, device="cpu", dtype=torch.float32, progress=False)
    check_against(conditional_refs, model, paged_runner)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_conditional_generation_bf16_within_transformers_bf16_noise(
    conditional_ckpt, conditional_refs, paged_runner, device
) -> None:
    lengths = (64, 65)
    fp32 = [r for r in conditional_refs if len(r.prompt) in lengths]
    hf16 = hf_reference(conditional_ckpt, conditional=True, dtype=torch.bfloat16, lengths=lengths)
    model = load_model(conditional_ckpt, device=device, dtype=torch.bfloat16, progress=False)
    prefill, decode = run_packed(model, fp32, paged_runner)
    for i, ref in enumerate(fp32):
        for ours, theirs, exact in (
            (prefill[i], hf16[i].prefill, ref.prefill),
            (decode[i], hf16[i].decode, ref.decode),
        ):
            noise = _mean_rel_err(theirs, exact)
            assert _mean_rel_err(ours, exact) <= BF16_NOISE_FACTOR * noise + BF16_SLACK


@pytest.mark.gpu
def test_cuda_kernels_match_transformers_fp32(causal_ckpt, causal_refs, paged_runner) -> None:
    model = load_model(causal_ckpt, device="cuda", dtype=torch.float32, progress=False)
    assert model.ops.is_triton
    check_against(causal_refs, model, paged_runner, CUDA_FP32_TOL)


def test_triton_prefill_builds_index_tables_once_per_step(
    conditional_ckpt, paged_runner, monkeypatch
) -> None:
    """The GDN chunk table and the attention tile map are built by the first layer of each kind
    and shared by the rest of the step (ForwardBatch.index_cache); logits match the references."""
    from sparkinfer.kernels.gated_delta_rule import chunk
    from sparkinfer.kernels.paged_attention import prefill
    from sparkinfer.model.layers import REFERENCE_OPS, triton_ops

    built = {"chunk": 0, "tile": 0}

    def counted(name, fn):
        def wrapper(*args):
            built[name] += 1
            return fn(*args)

        return wrapper

    monkeypatch.setattr(chunk, "chunk_index_tables", counted("chunk", chunk.chunk_index_tables))
    monkeypatch.setattr(prefill, "_tile_map", counted("tile", prefill._tile_map))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(conditional_ckpt, device=device, dtype=torch.float32, progress=False)
    step = [(0, _tokens(20, seed=1)), (1, _tokens(9, seed=2))]
    logits = {}
    for name, ops in (("triton", triton_ops()), ("reference", REFERENCE_OPS)):
        model.use_ops(ops)
        logits[name] = torch.cat(paged_runner(model, max_lens=[20, 9]).step(step))
    assert built == {"chunk": 1, "tile": 1}  # 6 GDN and 2 attention layers
    assert _rel_err(logits["triton"], logits["reference"]) <= CUDA_FP32_TOL


def test_chunked_prefill_equals_one_shot(causal_refs, causal_model, paged_runner) -> None:
    """The 500-token prompt over four steps (one a lone token), sharing steps with a decode."""
    ref, other = causal_refs[4], causal_refs[2]
    runner = paged_runner(causal_model, max_lens=[len(ref.prompt), len(other.prompt) + 4], seed=3)
    runner.step([(1, other.prompt)])
    pieces, start = [], 0
    for i, n in enumerate((130, 64, 1, 305)):
        out = runner.step([(0, ref.prompt[start : start + n]), (1, other.decode_ids[i : i + 1])])
        pieces.append(out[0])
        assert _rel_err(out[1][0], other.decode[i]) <= FP32_TOL
        start += n
    assert _rel_err(torch.cat(pieces), ref.prefill) <= FP32_TOL


def test_packed_batch_equals_each_alone(causal_refs, causal_model, paged_runner) -> None:
    refs = [causal_refs[i] for i in (3, 0, 2)]
    packed = paged_runner(causal_model, max_lens=[len(r.prompt) for r in refs])
    together = packed.step([(i, r.prompt) for i, r in enumerate(refs)])
    for i, r in enumerate(refs):
        alone = paged_runner(causal_model, max_lens=[len(r.prompt)], seed=7).step([(0, r.prompt)])
        torch.testing.assert_close(together[i], alone[0], rtol=0, atol=1e-5)


def test_decode_is_deterministic_across_batch_composition(
    causal_refs, causal_model, paged_runner
) -> None:
    """Greedy continuation of one prompt alone equals the same prompt decoded beside others."""

    def greedy(runner, seqs: list[int]) -> list[int]:
        logits = runner.step([(s, causal_refs[s].prompt) for s in seqs])
        tokens, out = [int(logits[0][-1].argmax())], []
        for _ in range(8):
            out.append(tokens[-1])
            step = runner.step([(s, torch.tensor([tokens[-1]])) for s in seqs])
            tokens.append(int(step[0][0].argmax()))
        return out

    lens = [len(r.prompt) + 9 for r in causal_refs]
    alone = greedy(paged_runner(causal_model, max_lens=lens), [3])
    beside = greedy(paged_runner(causal_model, max_lens=lens, seed=5), [3, 1, 4])
    assert alone == beside


def test_mrope_positions_equal_text_positions_for_text(causal_model) -> None:
    rope = causal_model.model.rotary_emb
    pos = torch.arange(300)
    for a, b in zip(rope(pos), rope(pos.expand(3, -1)), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@torch.no_grad()
def test_mrope_positions_match_transformers(causal_ckpt: Path, causal_model, paged_runner) -> None:
    """Distinct (t, h, w) positions, as vision tokens get them, through the whole model."""
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(causal_ckpt, dtype=torch.float32).eval()
    prompt, idx = _tokens(80, seed=80), torch.arange(80)
    positions = torch.stack([idx // 4, idx % 7 + idx // 4, idx % 5 + idx // 4])
    ref = hf(input_ids=prompt[None], position_ids=positions[:, None, :]).logits[0]
    runner = paged_runner(causal_model, max_lens=[80])
    batch = ForwardBatch.build(
        [80], [0], runner.tables, runner.slots, caches=runner.caches, block_size=16, device="cpu",
        positions=positions,
    )  # fmt: skip
    ours = causal_model.compute_logits(causal_model(prompt, batch))
    assert _rel_err(ours, ref) <= FP32_TOL


def test_mrope_interleaving_matches_transformers() -> None:
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    rope = {**TEXT_ROPE, "mrope_section": [11, 11, 10]}
    hf_cfg = Qwen3_5TextConfig(head_dim=256, rope_parameters=rope)
    hf = Qwen3_5TextRotaryEmbedding(hf_cfg)
    pos = torch.stack([torch.arange(40) + 5, torch.arange(40) % 7 + 9, torch.arange(40) // 3])
    hf_cos, hf_sin = hf(torch.zeros(1, dtype=torch.float32), pos[:, None, :])
    ours = RotaryEmbedding(64, 1e7, (11, 11, 10), device=torch.device("cpu"))
    cos, sin = ours(pos)
    torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=1e-6)


def test_padded_vocab_ids_are_masked(causal_ckpt: Path) -> None:
    model = load_model(causal_ckpt, device="cpu", dtype=torch.float32, progress=False)
    masked = Qwen3_8ForCausalLM(
        model.config, device="cpu", dtype=torch.float32, num_real_tokens=300
    )
    masked.load_state_dict(model.state_dict())
    hidden = torch.randn(3, model.config.text.hidden_size)
    logits = masked.compute_logits(hidden)
    assert logits.dtype == torch.float32
    assert torch.isneginf(logits[:, 300:]).all()
    torch.testing.assert_close(logits[:, :300], model.compute_logits(hidden)[:, :300])


def test_inputs_embeds_replace_token_embeddings(causal_model, paged_runner) -> None:
    ids = _tokens(20, seed=9)
    a = paged_runner(causal_model, max_lens=[20])
    b = paged_runner(causal_model, max_lens=[20])
    batches = [
        ForwardBatch.build([20], [0], [r.tables[0]], [r.slots[0]], caches=r.caches,
                           block_size=16, device="cpu")
        for r in (a, b)
    ]  # fmt: skip
    h1 = causal_model(ids, batches[0])
    h2 = causal_model(ids, batches[1], inputs_embeds=causal_model.embed_input_ids(ids))
    torch.testing.assert_close(h1, h2, rtol=0, atol=0)


@pytest.mark.parametrize("last_layer", ["attention", "linear"])
def test_logits_rows_only_equals_the_gathered_full_forward(
    causal_model, paged_runner, last_layer
) -> None:
    """A prefill step where one chunk samples nothing, then a decode step sampling two of three
    rows, then a step sampling none: the pruned last layer gives the full forward's rows.
    `linear` drops the last layer so that a GDN layer ends the stack. (The kernels' own tests
    give them zero rows.)"""
    model = copy.deepcopy(causal_model)
    if last_layer == "linear":
        model.model.layers = model.model.layers[:-1]
        assert model.model.layers[-1].is_linear
    lens = [9, 5, 1]
    full, pruned = (paged_runner(model, max_lens=[n + 3 for n in lens]) for _ in range(2))
    steps = [
        ([_tokens(n, seed=20 + n) for n in lens], [8, 14]),  # the 5-token chunk samples nothing
        ([_tokens(1, seed=30 + i) for i in range(3)], [0, 2]),
        ([_tokens(2, seed=40 + i) for i in range(3)], []),
    ]
    for chunks, rows in steps:
        out = []
        for runner, only in ((full, False), (pruned, True)):
            batch = ForwardBatch.build(
                [len(c) for c in chunks], runner.cached, runner.tables, runner.slots,
                caches=runner.caches, block_size=16, device="cpu", logits_indices=rows,
            )  # fmt: skip
            hidden = model(torch.cat(chunks), batch, logits_rows_only=only)
            out.append(hidden if only else hidden[batch.logits_indices])
            runner.cached = [c + len(t) for c, t in zip(runner.cached, chunks, strict=True)]
        assert out[1].shape == (len(rows), model.config.text.hidden_size)
        torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-5)


def test_cache_spec_follows_layer_schedule(causal_model) -> None:
    spec = causal_model.cache_spec()
    assert [s.layer_idx for s in spec.attention] == [3]
    assert [s.layer_idx for s in spec.linear] == [0, 1, 2]
    lin = spec.linear[0]
    assert (lin.conv_len, lin.conv_dim, lin.num_v_heads) == (3, 2 * 32 + 48, 6)
    assert lin.state_dtype == torch.float32


def test_dtype_move_keeps_fp32_gates_and_moves_the_caches(causal_ckpt: Path) -> None:
    """`.to(bf16)` equals loading in bf16: weights cast, A_log / dt_bias kept fp32, caches bf16."""
    moved = load_model(causal_ckpt, device="cpu", dtype=torch.float32, progress=False)
    moved.to(torch.bfloat16)
    loaded = load_model(causal_ckpt, device="cpu", dtype=torch.bfloat16, progress=False)
    assert moved.dtype == torch.bfloat16 and moved.cache_spec() == loaded.cache_spec()
    want = loaded.state_dict()
    for name, value in moved.state_dict().items():
        assert value.dtype == want[name].dtype and torch.equal(value, want[name]), name
    assert moved.model.layers[0].linear_attn.A_log.dtype == torch.float32
    moved.to("meta")  # a device move takes the fp32 gates along
    gate = moved.model.layers[0].linear_attn.A_log
    assert gate.device.type == "meta" and gate.dtype == torch.float32
    assert isinstance(gate, torch.nn.Parameter) and moved.dtype == torch.bfloat16


TEXT_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}


# Multimodal prompts: processor -> vision tower -> merge -> MRoPE positions -> decoder, against
# transformers' Qwen3_5ForConditionalGeneration called with the same ids and pixels (conftest's
# mm_ckpt: image pad 300, video pad 301, vision start 302, end 303).


def _png_url(width: int, height: int, seed: int) -> str:
    import base64
    import io

    import numpy as np
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _mp4_url(num_frames: int, fps: int, size: int) -> str:
    import base64
    import io

    import av
    import numpy as np

    rng, buf = np.random.default_rng(0), io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for _ in range(num_frames):
            arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def mm_media() -> dict[str, object]:
    """Processed media: small bounds keep the grids tiny (real 16-px patches, 2x2 merge)."""
    from sparkinfer.multimodal import (
        MediaLimits,
        parse_processor_config,
        process_image,
        process_video,
    )

    config = parse_processor_config({"size": {"shortest_edge": 1024, "longest_edge": 1 << 20}})
    limits = MediaLimits()
    return {
        "wide": process_image(_png_url(96, 64, 1), field="a", config=config, limits=limits),
        "tall": process_image(_png_url(32, 96, 2), field="b", config=config, limits=limits),
        "video": process_video(_mp4_url(8, 4, 64), field="c", config=config, limits=limits),
    }


MM_CASES = {"one_image": ["wide"], "two_images": ["wide", "tall"], "video": ["video"]}


def _mm_prompt(media: list) -> list[int]:
    """Text, then each item's template triple followed by more text, expanded for the media."""
    from sparkinfer.multimodal import VisionTokenIds, expand_prompt

    ids = VisionTokenIds(image_pad=300, video_pad=301, vision_start=302, vision_end=303)
    prompt = [5, 17, 42]
    for i, item in enumerate(media):
        pad = ids.image_pad if item.kind == "image" else ids.video_pad
        prompt += [ids.vision_start, pad, ids.vision_end, 60 + i, 7]
    # timestamps (`<0.5 seconds>`) become ordinary text ids of this 320-token vocabulary
    return expand_prompt(
        prompt, media, token_ids=ids, encode_text=lambda s: [ord(c) % 250 for c in s]
    )


@pytest.mark.parametrize("case", MM_CASES)
@torch.no_grad()
def test_multimodal_prompt_matches_transformers(mm_ckpt, mm_media, paged_runner, case) -> None:
    from sparkinfer.model.mrope import get_rope_positions, text_positions
    from sparkinfer.model.vision import merge_vision_embeddings
    from transformers import Qwen3_5ForConditionalGeneration

    media = [mm_media[k] for k in MM_CASES[case]]
    ids = torch.tensor(_mm_prompt(media))
    images = [m for m in media if m.kind == "image"]
    videos = [m for m in media if m.kind == "video"]
    next_id = torch.tensor([11])

    hf = Qwen3_5ForConditionalGeneration.from_pretrained(mm_ckpt, dtype=torch.float32).eval()
    types = torch.where(ids == 300, 1, torch.where(ids == 301, 2, 0))
    kwargs = {"mm_token_type_ids": types[None], "use_cache": True}
    if images:
        kwargs["pixel_values"] = torch.cat([m.pixel_values for m in images])
        kwargs["image_grid_thw"] = torch.tensor([m.grid_thw for m in images])
    if videos:
        kwargs["pixel_values_videos"] = torch.cat([m.pixel_values for m in videos])
        kwargs["video_grid_thw"] = torch.tensor([m.grid_thw for m in videos])
    out = hf(input_ids=ids[None], **kwargs)
    cache_arg = "cache" if hasattr(out, "cache") else "past_key_values"
    ref_decode = hf(input_ids=next_id[None], use_cache=True, **{cache_arg: getattr(out, cache_arg)})

    model = load_model(mm_ckpt, device="cpu", dtype=torch.float32, progress=False)
    assert model.visual is not None
    vision = model.visual(torch.cat([m.pixel_values for m in media]), [m.grid_thw for m in media])
    is_pad = (ids == 300) | (ids == 301)
    embeds = merge_vision_embeddings(model.embed_input_ids(ids), is_pad, vision)
    rope = get_rope_positions(
        ids, [m.grid_thw for m in images], [m.grid_thw for m in videos],
        image_token_id=300, video_token_id=301,
    )  # fmt: skip
    runner = paged_runner(model, max_lens=[len(ids) + 1])
    batch = ForwardBatch.build(
        [len(ids)], [0], runner.tables, runner.slots, caches=runner.caches, block_size=16,
        device="cpu", positions=rope.positions,
    )  # fmt: skip
    prefill = model.compute_logits(model(ids, batch, inputs_embeds=embeds))
    assert _rel_err(prefill, out.logits[0]) <= FP32_TOL
    step = ForwardBatch.build(
        [1], [len(ids)], runner.tables, runner.slots, caches=runner.caches, block_size=16,
        device="cpu", positions=text_positions(len(ids), 1, rope.rope_delta),
    )  # fmt: skip
    decode = model.compute_logits(model(next_id, step))
    assert rope.rope_delta < 0  # the vision blocks use fewer positions than tokens
    assert _rel_err(decode, ref_decode.logits[0]) <= FP32_TOL


def test_vision_tower_needs_matching_width(mm_ckpt) -> None:
    from sparkinfer.model.config import load_model_config
    from sparkinfer.model.errors import ConfigError

    config = load_model_config(mm_ckpt)
    text_only = Qwen3_8ForCausalLM(config, device="cpu", dtype=torch.float32, use_vision=False)
    assert text_only.visual is None and not text_only.has_vision
    bad = dataclasses.replace(config, vision=dataclasses.replace(config.vision, out_hidden_size=8))
    with pytest.raises(ConfigError, match="out_hidden_size is 8"):
        Qwen3_8ForCausalLM(bad, device="cpu", dtype=torch.float32)


def test_layers_share_the_models_kernel_table(causal_ckpt: Path) -> None:
    model = load_model(causal_ckpt, device="cpu", dtype=torch.float32, progress=False)
    model.to(torch.float32)  # _apply runs; a CPU model keeps the references
    assert not model.ops.is_triton
    assert all(m.ops is model.ops for m in model.modules() if hasattr(m, "ops"))


@pytest.mark.gpu
def test_moving_to_cuda_switches_to_triton_kernels(causal_ckpt: Path) -> None:
    model = load_model(causal_ckpt, device="cpu", dtype=torch.float32, progress=False).to("cuda")
    assert model.ops.is_triton
    assert all(m.ops is model.ops for m in model.modules() if hasattr(m, "ops"))


@pytest.mark.parametrize("taps", [(0, 2), (-1, 1, 3)])
def test_tapped_hidden_states_equal_forward_hooks(causal_model, paged_runner, taps) -> None:
    """forward_tapped returns, in the same pass, what hooks on the embedding and the layers
    see: the residual stream after each tapped layer (the last one: the final-normed output),
    over every token of a two-sequence prefill and then a decode step; its output is forward's."""
    model = copy.deepcopy(causal_model)
    model.set_tap_layers(taps)
    seen: dict[int, torch.Tensor] = {}
    hooks = [model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.update({-1: o}))]
    for i, layer in enumerate(model.model.layers):
        hook = lambda m, i_, o, i=i: seen.update({i: o[0] + o[1]})
        hooks.append(layer.register_forward_hook(hook))
    tapped_run, plain_run = (paged_runner(model, max_lens=[12, 8]) for _ in range(2))
    last = model.config.text.num_hidden_layers - 1
    for chunks in ([_tokens(9, seed=1), _tokens(5, seed=2)], [_tokens(1, seed=3)] * 2):
        batches = [
            ForwardBatch.build(
                [len(c) for c in chunks],
                r.cached,
                r.tables,
                r.slots,
                caches=r.caches,
                block_size=16,
                device="cpu",
            )
            for r in (plain_run, tapped_run)
        ]
        plain = model(torch.cat(chunks), batches[0])
        out = model.forward_tapped(torch.cat(chunks), batches[1])
        for r in (plain_run, tapped_run):
            r.cached = [c + len(t) for c, t in zip(r.cached, chunks, strict=True)]
        want = [out.hidden if i == last else seen[i] for i in taps]
        assert torch.equal(out.tapped, torch.cat(want, dim=-1))
        assert torch.equal(out.hidden, plain)
    for hook in hooks:
        hook.remove()


def test_tap_layers_out_of_range_or_with_pruned_last_layer_are_refused(
    causal_model, paged_runner
) -> None:
    from sparkinfer.model.errors import ConfigError

    model = copy.deepcopy(causal_model)
    with pytest.raises(ConfigError, match=r"tap layers \[0, 4\].*\[-1, 3\]"):
        model.set_tap_layers((0, 4))
    model.set_tap_layers((1, 3))
    r = paged_runner(model, max_lens=[4])
    batch = ForwardBatch.build(
        [2], r.cached, r.tables, r.slots, caches=r.caches, block_size=16, device="cpu"
    )
    with pytest.raises(ConfigError, match="logits_rows_only=False"):
        model.forward_tapped(torch.tensor([1, 2]), batch, logits_rows_only=True)
