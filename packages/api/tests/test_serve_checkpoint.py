"""`--model DIR` serves a checkpoint folder exactly as transformers wrote it, with no conversion."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from sparkinfer.model.tokenizer import Tokenizer

from .conftest import serve

VOCAB = 248320  # the real padded vocabulary, so the embedded tokenizer's ids all fit
NUM_REAL_TOKENS = 248077
TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 2048,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
    "eos_token_id": 248046,
}
PROMPT = [9419, 11, 1204, 513, 488, 30, 248046, 198]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A random Qwen3_5ForCausalLM saved by transformers, and its own greedy continuation."""
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TEXT)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.1)
    path = tmp_path_factory.mktemp("hf-checkpoint")
    model.save_pretrained(path)
    GenerationConfig(do_sample=True, temperature=1.0, top_k=20, top_p=0.95,
                     eos_token_id=[248046, 248044]).save_pretrained(path)  # fmt: skip
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=6,
            do_sample=False,
            suppress_tokens=list(range(NUM_REAL_TOKENS, VOCAB)),  # padded ids never sampled
            eos_token_id=None,
        )
    return path, out[0, len(PROMPT) :].tolist()


def test_serves_a_transformers_checkpoint_folder(checkpoint: tuple[Path, list[int]]) -> None:
    path, hf_greedy = checkpoint
    with serve(model=str(path), max_num_seqs=2) as server:
        models = httpx.get(server.v1 + "/models", timeout=10).json()["data"]
        assert models[0]["id"] == str(path)
        assert models[0]["max_model_len"] == 1024
        body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
        resp = httpx.post(server.v1 + "/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        # Same greedy tokens as transformers' own generate() on the same folder.
        assert choice["text"] == Tokenizer.embedded().decode(hf_greedy)
