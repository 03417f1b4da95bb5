"""The small heads on top of a block drafter's output rows.

- `CandidateSelector` (DFlash2): per block row, the top-k tokens of the drafter's logits; a path
  through them is chosen row by row, each step scoring candidate c after the previous pick p as
  logit(c) + sum_r P[p, r] * h[r] * S[c, r], with h the row's hidden state projected to the
  selector's rank and P, S the predecessor and successor codebooks.
- `MarkovHead` (DSpark, vanilla): row by row, logits + w2 @ w1[previous token], the previous
  token being the anchor for the first row and the row before's pick after it.
- `ConfidenceHead` (DSpark): a linear probe giving each row a logit of its conditional
  acceptance probability (sigmoid), from its hidden state, with the Markov embedding of its
  previous token appended when `confidence_head_with_markov`.

`pick` chooses one column per row of a [B, C] score matrix: argmax (greedy) unless the caller
samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from sparkinfer.model.layers import KernelOps, new_parameter
from sparkinfer.model.layers.linear import Linear
from torch import nn

Pick = Callable[[torch.Tensor], torch.Tensor]  # scores [B, C] -> chosen column [B] int64


def pick_argmax(scores: torch.Tensor) -> torch.Tensor:
    """The greedy pick: the highest score's column, [B, C] -> [B]."""
    return scores.argmax(dim=-1)


class ChainedDraft(NamedTuple):
    """Draft tokens picked row by row, and the scores each was picked from (the drafter's
    distribution q, as logits): over the vocabulary, or over `candidates` (DFlash2)."""

    tokens: torch.Tensor  # [B, n] int64
    scores: torch.Tensor  # [B, n, V] or [B, n, k] fp32
    candidates: torch.Tensor | None  # [B, n, k] int64 token ids of the scores' columns


class CandidateSelector(nn.Module):
    """`candidate_selector.*` of a DFlash2 drafter."""

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        rank: int,
        top_k: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = Linear(hidden_size, rank, ops=ops, device=device, dtype=dtype)
        self.predecessor_codebook = new_parameter(vocab_size, rank, device=device, dtype=dtype)
        self.successor_codebook = new_parameter(vocab_size, rank, device=device, dtype=dtype)

    def select(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, pick: Pick
    ) -> ChainedDraft:
        """hidden [B, n, hidden], logits [B, n, V] fp32, anchor_ids [B] -> the chosen path."""
        b, n, width = hidden.shape
        unary, candidates = torch.topk(logits, self.top_k, dim=-1)  # [B, n, k]
        h = self.hidden_projection(hidden.reshape(b * n, width)).view(b, n, -1).float()
        prev = anchor_ids
        tokens, scores = [], []
        for j in range(n):
            pred = F.embedding(prev, self.predecessor_codebook).float() * h[:, j]  # [B, r]
            succ = F.embedding(candidates[:, j], self.successor_codebook).float()  # [B, k, r]
            row = unary[:, j] + torch.einsum("br,bkr->bk", pred, succ)
            prev = candidates[:, j].gather(-1, pick(row)[:, None])[:, 0]
            tokens.append(prev)
            scores.append(row)
        return ChainedDraft(torch.stack(tokens, 1), torch.stack(scores, 1), candidates)


class _Table(nn.Module):
    """A bare `weight` (the checkpoint stores the Markov matrices as `<name>.weight`)."""

    def __init__(self, rows: int, cols: int, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = new_parameter(rows, cols, device=device, dtype=dtype)


class MarkovHead(nn.Module):
    """`markov_head.*` of a DSpark drafter: markov_w1.weight [V, r] (an embedding) and
    markov_w2.weight [V, r] (a projection from rank r back to the vocabulary)."""

    def __init__(
        self, vocab_size: int, rank: int, *, device: torch.device, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.markov_w1 = _Table(vocab_size, rank, device=device, dtype=dtype)
        self.markov_w2 = _Table(vocab_size, rank, device=device, dtype=dtype)

    def embed_previous(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [...] -> w1 rows [..., r]."""
        return F.embedding(token_ids, self.markov_w1.weight)

    def chain(self, logits: torch.Tensor, anchor_ids: torch.Tensor, pick: Pick) -> ChainedDraft:
        """logits [B, n, V] fp32 (the drafter's), anchor_ids [B] -> tokens picked row by row
        from logits + w2 @ w1[previous token]."""
        prev = anchor_ids
        tokens, scores = [], []
        for j in range(logits.shape[1]):
            row = logits[:, j] + F.linear(self.embed_previous(prev), self.markov_w2.weight).float()
            prev = pick(row)
            tokens.append(prev)
            scores.append(row)
        return ChainedDraft(torch.stack(tokens, 1), torch.stack(scores, 1), None)


class ConfidenceHead(nn.Module):
    """`confidence_head.proj` of a DSpark drafter: weight [1, in_features], bias [1]."""

    def __init__(self, in_features: int, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, 1, device=device, dtype=dtype)
        self.proj.requires_grad_(False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., in_features] -> acceptance logits [...] fp32."""
        return self.proj(features).squeeze(-1).float()
