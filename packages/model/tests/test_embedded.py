"""The built-in random-weight model: Qwen3.8 shape, deterministic weights, sane activations."""

from __future__ import annotations

import pytest
import torch
from sparkinfer.model.config import FULL_ATTENTION, LINEAR_ATTENTION
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.embedded import (
    RANDOM_GENERATION_DEFAULTS,
    RANDOM_MODEL_ID,
    RANDOM_NUM_REAL_TOKENS,
    build_random_model,
    random_model_config,
)


@pytest.fixture(scope="module")
def model() -> Qwen3_8ForCausalLM:
    return build_random_model(device="cpu", dtype=torch.bfloat16)


def test_config_has_the_qwen38_shape() -> None:
    config = random_model_config()
    text = config.text
    assert RANDOM_MODEL_ID == "sparkinfer/qwen3.8-embedded-random"
    assert text.vocab_size == 248320 and text.num_hidden_layers == 8
    assert text.layer_types == ((LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,)) * 2
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (4, 1, 64)
    assert text.rotary_dim == 16
    assert (text.linear_num_key_heads, text.linear_num_value_heads) == (4, 8)
    assert config.context_len == 262144
    assert (config.image_token_id, config.video_token_id) == (248056, 248057)
    assert config.vision is not None and config.vision.out_hidden_size == text.hidden_size
    assert (config.vision.patch_size, config.vision.spatial_merge_size) == (16, 2)
    assert RANDOM_GENERATION_DEFAULTS.eos_token_ids == (248046, 248044)
    assert (RANDOM_GENERATION_DEFAULTS.top_k, RANDOM_GENERATION_DEFAULTS.top_p) == (20, 0.95)


def test_weights_are_deterministic(model) -> None:
    again = build_random_model(device="cpu", dtype=torch.bfloat16)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert model.model.layers[0].linear_attn.A_log.dtype == torch.float32


def test_vision_tower_gives_one_finite_row_per_pad_token(model) -> None:
    assert model.visual is not None
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randn(2 * 4 * 6 + 8 * 8, 1536, generator=gen)
    rows = model.visual(pixels, [(2, 4, 6), (1, 8, 8)])
    assert rows.shape == (2 * 6 + 16, 256) and torch.isfinite(rows).all()
    assert 1e-3 < rows.float().std() < 10


def test_greedy_generation_is_sane_and_reproducible(model, paged_runner) -> None:
    prompt = torch.tensor([248045, 846, 198, 9419, 11, 1204, 248046, 198, 248045, 74455, 198])

    def generate() -> tuple[list[int], torch.Tensor]:
        runner = paged_runner(model, max_lens=[len(prompt) + 8])
        logits = runner.step([(0, prompt)])[0][-1]
        first, tokens = logits, []
        for _ in range(6):
            tokens.append(int(logits.argmax()))
            logits = runner.step([(0, torch.tensor(tokens[-1:]))])[0][0]
        return tokens, first

    tokens, logits = generate()
    assert torch.isfinite(logits[:RANDOM_NUM_REAL_TOKENS]).all()
    assert torch.isneginf(logits[RANDOM_NUM_REAL_TOKENS:]).all()
    assert 0.01 < logits[:RANDOM_NUM_REAL_TOKENS].std() < 100
    assert all(t < RANDOM_NUM_REAL_TOKENS for t in tokens)
    assert generate()[0] == tokens


EMBEDDED_BUDGET_BYTES = 40 * 1024 * 1024


def test_the_default_is_the_shipped_trained_checkpoint() -> None:
    """The shipped checkpoint loads with its tokenizer; everything under embedded_checkpoint/,
    the block drafter in dflash/ included, fits EMBEDDED_BUDGET_BYTES (40 MiB): it all travels
    with the package."""
    from sparkinfer.model.config import load_model_config
    from sparkinfer.model.embedded import EMBEDDED_MODEL_ID, embedded_checkpoint_dir
    from sparkinfer.model.tokenizer import Tokenizer

    folder = embedded_checkpoint_dir()
    assert EMBEDDED_MODEL_ID == "sparkinfer/qwen3.8-code-tiny"
    shipped = [f for f in folder.rglob("*") if f.is_file()]
    assert any(f.parent.name == "dflash" for f in shipped)  # the drafter counts too
    assert sum(f.stat().st_size for f in shipped) <= EMBEDDED_BUDGET_BYTES
    config = load_model_config(folder)
    tok = Tokenizer.from_checkpoint(folder)
    assert config.text.vocab_size == tok.vocab_size == 8192
    assert config.text.tie_word_embeddings and config.vision is not None
    assert config.image_token_id == tok.control_tokens["<|image_pad|>"]
