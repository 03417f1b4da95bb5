"""Test helpers: a fake runner, a tiny random model on CPU, and a plain reference decode."""

from __future__ import annotations

import torch
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.config import parse_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.scheduler.batch import ModelOutput, SampledToken, ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.request import TokenLogprob


class FakeRunner:
    """Next token = a hash of the request's tokens so far, so recompute gives the same output.

    Prompt logprobs are fake too: prompt token i gets logprob -i (see `fake_prompt_logprobs`).
    """

    def __init__(self, *, num_blocks: int = 64, num_slots: int = 8, vocab_size: int = 100) -> None:
        self.num_blocks = num_blocks
        self.num_slots = num_slots
        self.vocab_size = vocab_size
        self.block_size = 4
        self.batches: list[ScheduledBatch] = []
        self.fail_when: set[str] = set()  # request ids whose step raises
        self.is_closed = False

    def run(self, batch: ScheduledBatch) -> ModelOutput:
        self.batches.append(batch)
        slots = [s.req.state_slot for s in batch.seqs]
        assert None not in slots and len(set(slots)) == len(slots), slots
        blocks = [b for s in batch.seqs for b in s.req.block_ids]
        assert len(set(blocks)) == len(blocks), "a block is held twice"
        for s in batch.seqs:
            needed = s.num_cached_tokens + s.num_new_tokens
            assert len(s.req.block_ids) * self.block_size >= needed
            if s.req.request_id in self.fail_when:
                raise RuntimeError(f"boom in {s.req.request_id}")
        return ModelOutput(
            samples={
                s.req.request_id: SampledToken(next_token(s.req.token_ids, self.vocab_size))
                for s in batch.seqs
                if s.is_sampled
            },
            prompt_logprobs={
                s.req.request_id: _fake_prompt_logprobs(s)
                for s in batch.seqs
                if s.num_prompt_logprobs
            },
        )

    def check_multimodal(self, prompt_token_ids, mm) -> None:
        """Media are not run here: any well-formed multimodal input is accepted."""

    def close(self) -> None:
        self.is_closed = True


def fake_prompt_logprobs(prompt: list[int]) -> tuple[TokenLogprob, ...]:
    """What FakeRunner reports for a whole prompt: token i (from 1) has logprob -i."""
    return tuple(TokenLogprob(t, -float(i)) for i, t in enumerate(prompt) if i > 0)


def _fake_prompt_logprobs(seq: ScheduledSeq) -> tuple[TokenLogprob, ...]:
    start = seq.num_cached_tokens + 1
    targets = seq.req.token_ids[start : start + seq.num_prompt_logprobs]
    return tuple(TokenLogprob(t, -float(start + j)) for j, t in enumerate(targets))


def next_token(tokens: list[int], vocab_size: int) -> int:
    return (sum(tokens) * 31 + len(tokens)) % vocab_size


TINY_CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 512,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}


def build_tiny_model(seed: int = 0) -> Qwen3_8ForCausalLM:
    """A 4-layer (3 GDN + 1 attention) model with random weights, fp32 on CPU."""
    model = Qwen3_8ForCausalLM(
        parse_model_config(TINY_CONFIG), device="cpu", dtype=torch.float32, num_real_tokens=250
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.rand(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5))
    return model.eval()


def reference_greedy(model: Qwen3_8ForCausalLM, prompt: list[int], num_new: int) -> list[int]:
    """Prefill the prompt in one forward, then decode token by token: no engine involved."""
    block_size = 16
    num_blocks = -(-(len(prompt) + num_new) // block_size)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=block_size, num_slots=1, device="cpu"
    )
    table = list(range(num_blocks))
    tokens = list(prompt)
    cached, new = 0, list(prompt)
    for _ in range(num_new):
        batch = ForwardBatch.build(
            [len(new)], [cached], [table], [0], caches=caches, block_size=block_size, device="cpu"
        )
        hidden = model(torch.tensor(new), batch)
        token = int(model.compute_logits(hidden[batch.logits_indices]).argmax(-1))
        tokens.append(token)
        cached += len(new)
        new = [token]
    return tokens[len(prompt) :]


def reference_logits(model: Qwen3_8ForCausalLM, tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), vocab] fp32 of one plain forward over the whole sequence."""
    block_size = 16
    num_blocks = -(-len(tokens) // block_size)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=block_size, num_slots=1, device="cpu"
    )
    batch = ForwardBatch.build(
        [len(tokens)], [0], [list(range(num_blocks))], [0],
        caches=caches, block_size=block_size, device="cpu",
    )  # fmt: skip
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(tokens), batch))
