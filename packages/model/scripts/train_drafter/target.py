"""The target model under transformers: its greedy continuations of the prompts, and the hidden
states of the tapped layers over prompt and continuation (what the drafter reads as context).

Tap i is transformers' `hidden_states[i + 1]`, the residual stream after layer i, as
`Qwen3_8ForCausalLM.forward_tapped` gives it in the server (docs/model.md §17).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sparkinfer.model.tokenizer import QWEN_EOS_TOKENS, Tokenizer
from transformers import GenerationConfig, Qwen3_5ForCausalLM

CHECKED_ROWS = 64  # rows of each batch whose greedy tokens are checked


@dataclass
class Sequences:
    """Prompts with the target's greedy continuations, right-padded, and their tapped states."""

    ids: torch.Tensor  # [N, L] int64
    taps: torch.Tensor  # [N, L, n_taps * hidden]
    lengths: torch.Tensor  # [N] int64: prompt + continuation (through the end token if any)
    starts: torch.Tensor  # [N] int64: the first generated position (the prompt's length)
    kinds: list[str]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def split(self, chosen: Callable[[str], bool]) -> tuple[Sequences, Sequences]:
        """(the sequences whose kind is chosen, the rest)."""
        parts = []
        for want in (True, False):
            rows = [i for i, k in enumerate(self.kinds) if chosen(k) == want]
            idx = torch.tensor(rows, dtype=torch.int64, device=self.ids.device)
            parts.append(Sequences(
                self.ids[idx], self.taps[idx], self.lengths[idx], self.starts[idx],
                [self.kinds[i] for i in rows],
            ))  # fmt: skip
        return parts[0], parts[1]


def _left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


class TargetModel:
    """The target checkpoint in transformers' Qwen3.5 text model, in fp32, for generation."""

    def __init__(self, folder: Path, device: torch.device) -> None:
        self.device = device
        model: Any = Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model = model.to(device).eval()
        tokenizer = Tokenizer.from_checkpoint(folder)
        self.eos = [tokenizer.control_tokens[t] for t in QWEN_EOS_TOKENS]
        self.pad = tokenizer.control_tokens["<|endoftext|>"]
        self.embed_weight = self.model.get_input_embeddings().weight.detach()
        self.lm_head_weight = self.model.get_output_embeddings().weight.detach()

    @torch.no_grad()
    def continue_greedily(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Each prompt followed by the target's greedy continuation, cut after the first end
        token (as the server stops) or at max_new_tokens."""
        ids, mask = _left_padded(prompts, self.pad)
        config = GenerationConfig(
            do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=1,
            eos_token_id=self.eos, pad_token_id=self.pad,
        )  # fmt: skip
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=config,
        )
        rows: list[list[int]] = []
        for prompt, new in zip(prompts, out[:, ids.shape[1] :].tolist(), strict=True):
            ends = [i for i, t in enumerate(new) if t in self.eos]
            rows.append(prompt + new[: ends[0] + 1 if ends else len(new)])
        return rows

    @torch.no_grad()
    def tapped_states(
        self, rows: list[list[int]], starts: list[int], tap_layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, int, int]:
        """([N, L, len(tap_layers) * hidden] fp32: the tapped layers' states of right-padded rows
        (padding positions hold whatever the model gives; nothing reads them), then how many of
        the first rows' generated tokens are the argmax of this forward, and of how many: a
        check that generation was greedy and its padding harmless)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        out = self.model.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            output_hidden_states=True,
        )
        states = out.hidden_states
        assert states is not None
        agree = total = 0
        for i in range(min(CHECKED_ROWS, len(rows))):
            n, s = len(rows[i]), starts[i]
            logits = self.model.lm_head(out.last_hidden_state[i, s - 1 : n - 1])
            agree += int((logits.argmax(-1).cpu() == ids[i, s:n]).sum())
            total += n - s
        return torch.cat([states[i + 1] for i in tap_layers], dim=-1), agree, total
