"""The block drafter of the DFlash family (DFlash, DFlash2, DSpark; docs/model.md §17).

A few Qwen3-style decoder layers propose a block of tokens in one forward:

- context: the target's hidden states at `target_layer_ids`, concatenated per token, go through
  `fc` and `hidden_norm`; every drafter layer projects them to its own K/V (k_norm, rope at the
  token's position) and keeps them in the drafter's cache (`cache.py`), written once per token.
- block: row 0 holds the anchor (the last verified token, at position p), rows 1..S-1 the mask
  token (positions p+1..); their embeddings (the target's `embed_tokens`) run through the layers,
  each row attending to the context before p and to every row of its own block (non-causal;
  within a sliding window where the layer has one); the final `norm` and the target's `lm_head`
  give the logits. DFlash rows 1..S-1 predict their own tokens (S-1 drafts); DSpark rows
  0..S-1 predict the token after them (S drafts).
- DFlash2 wraps each layer's attention and MLP in an in-block convolution (`block_conv.py`) and
  picks its drafts through a candidate selector; DSpark adds a Markov head and a confidence head
  (`heads.py`).

Parameters keep the checkpoint's names (`fc.weight`, `layers.N.self_attn.q_proj.weight`, ...),
so loading is an identity map (`drafters/weights.py`). The embedding and the LM head are the
target's, held by reference (`SharedTargetModules`), never copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from sparkinfer.model.drafters.cache import DrafterCache, DrafterCacheSpec, cache_rows
from sparkinfer.model.drafters.config import DFLASH2, DrafterConfig
from sparkinfer.model.drafters.heads import (
    CandidateSelector,
    ChainedDraft,
    ConfidenceHead,
    MarkovHead,
    Pick,
    pick_argmax,
)
from sparkinfer.model.drafters.layers import BlockRows, DraftLayer, DraftRMSNorm
from sparkinfer.model.errors import ConfigError
from sparkinfer.model.layers import KernelOps
from sparkinfer.model.layers.embedding import Embedding, LMHead
from sparkinfer.model.layers.linear import Linear
from sparkinfer.model.layers.rotary import RotaryEmbedding
from torch import nn


@dataclass(frozen=True)
class SharedTargetModules:
    """The target's token embedding and LM head, which the drafter reads but does not own."""

    embed_tokens: Embedding
    lm_head: LMHead


class BlockDraft(NamedTuple):
    """One block proposal per sequence: the rows that predict draft tokens."""

    hidden: torch.Tensor  # [B, n, hidden] after the final norm
    logits: torch.Tensor  # [B, n, V] fp32, padded ids at -inf


def block_visibility(
    anchor_positions: torch.Tensor,
    block_size: int,
    num_keys: int,
    *,
    window: int | None,
    is_causal: bool,
) -> torch.Tensor:
    """[B, 1, S, num_keys] bool: which cache positions each block row attends to.

    Row j of sequence b sits at q = anchor + j and sees key position k when k < anchor + S (the
    context and its whole block), |q - k| < window with a window, and k <= q if causal.
    """
    q = anchor_positions[:, None, None] + torch.arange(block_size, device=anchor_positions.device)
    q = q[..., None]  # [B, 1, S, 1]
    k = torch.arange(num_keys, device=anchor_positions.device)  # [L]
    visible = k < anchor_positions[:, None, None, None] + block_size
    if window is not None:
        visible = visible & (q - k < window) & (k - q < window)
    if is_causal:
        visible = visible & (k <= q)
    return visible.expand(anchor_positions.shape[0], 1, block_size, num_keys)


class BlockDrafter(nn.Module):
    """A DFlash / DFlash2 / DSpark drafter (see the module docstring) for one target model.

    Args:
        config: the drafter's config, already checked against the target (`check_drafter_fits`).
        shared: the target's embedding and LM head.
        ops, device, dtype: as the target's (its `ops` pick the linear kernels on CUDA).
    """

    def __init__(
        self,
        config: DrafterConfig,
        shared: SharedTargetModules,
        *,
        ops: KernelOps,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        dims = {"device": device, "dtype": dtype}
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self.shared = shared
        self.dtype = dtype
        # False: every proposal gathers and masks its keys (development tools compare the two)
        self.use_paged_attention = True
        self.fc = Linear(config.num_taps * hidden, hidden, ops=ops, **dims)
        self.hidden_norm = DraftRMSNorm(hidden, eps, **dims)
        self.layers = nn.ModuleList(
            DraftLayer(config, i, ops=ops, **dims) for i in range(config.num_hidden_layers)
        )
        self.norm = DraftRMSNorm(hidden, eps, **dims)
        self.rotary_emb = RotaryEmbedding(
            config.head_dim, config.rope_theta, (0, 0, 0), device=device
        )
        self.candidate_selector: CandidateSelector | None = None
        self.markov_head: MarkovHead | None = None
        self.confidence_head: ConfidenceHead | None = None
        if config.layout == DFLASH2:
            self.candidate_selector = CandidateSelector(
                hidden, config.vocab_size, config.selector_rank, config.selector_top_k,
                ops=ops, **dims,
            )  # fmt: skip
        if config.markov_rank:
            self.markov_head = MarkovHead(config.vocab_size, config.markov_rank, **dims)
        if config.has_confidence_head:
            extra = config.markov_rank if config.confidence_with_markov else 0
            self.confidence_head = ConfidenceHead(hidden + extra, **dims)

    def cache_spec(self) -> DrafterCacheSpec:
        """The drafter's K/V per token (`cache.allocate_drafter_cache` allocates it, paged like
        the target's KV: the target's block tables address it too)."""
        c = self.config
        return DrafterCacheSpec(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype)

    def reads_paged(self, cache: DrafterCache) -> bool:
        """Whether a proposal's attention reads the cache's pages directly (pages of a power of
        two >= 16 positions: the decode kernel where every block row sees the whole context and
        block, the block kernel under a window or a causal block), so its shapes do not depend
        on the context's length; else it gathers num_keys positions per row and masks them."""
        page = cache.block_size
        return self.use_paged_attention and page >= 16 and page & (page - 1) == 0

    @torch.inference_mode()
    def write_context(
        self,
        tapped: torch.Tensor,
        positions: torch.Tensor,
        cache: DrafterCache,
        *,
        block_tables: torch.Tensor,
        seq_ids: torch.Tensor,
    ) -> None:
        """Write each layer's K/V of N verified tokens into the cache.

        tapped [N, num_taps * hidden]: the target's `forward_tapped(...).tapped` rows of those
        tokens; positions [N], seq_ids [N] int64: each token's position and its sequence's row
        in block_tables [B, M] (its pages). Rewriting a position (after a rejection) replaces
        what the block scratch left there.
        """
        tables = block_tables.index_select(0, seq_ids)
        rows = cache_rows(tables, positions[:, None], cache.block_size)[:, 0]
        self.write_context_rows(tapped, positions, cache, rows=rows)

    @torch.inference_mode()
    def write_context_rows(
        self, tapped: torch.Tensor, positions: torch.Tensor, cache: DrafterCache, *,
        rows: torch.Tensor,
    ) -> None:  # fmt: skip
        """`write_context` with each token's cache row given: rows [N] int64 (`cache_rows`)."""
        ctx = self.hidden_norm(self.fc(tapped.to(self.dtype)))
        cos, sin = self.rotary_emb(positions)
        for layer in self.layers:
            assert isinstance(layer, DraftLayer)
            attn = layer.self_attn
            k, v = attn.key_value(ctx, cos, sin)
            cache.k[attn.layer_idx].index_copy_(0, rows, k)
            cache.v[attn.layer_idx].index_copy_(0, rows, v)

    @torch.inference_mode()
    def propose(
        self,
        anchor_ids: torch.Tensor,
        anchor_positions: torch.Tensor,
        cache: DrafterCache,
        *,
        block_tables: torch.Tensor,
        num_keys: int,
    ) -> BlockDraft:
        """One block per sequence: anchor_ids, anchor_positions [B] int64 (the last verified
        token and its position = the number of context tokens written before it); block_tables
        [B, M] the sequences' pages, covering positions 0 .. num_keys - 1 (pad with any page).

        num_keys: positions read per row, at least max(anchor_positions) + block_size (a host
        value, so the shapes stay fixed under a CUDA graph; where `reads_paged`, each row reads
        its own anchor + block_size positions, and num_keys only bounds the tables). The block
        rows' K/V are written at anchor .. anchor + block_size - 1 as scratch.
        """
        c = self.config
        b, s = anchor_ids.shape[0], c.block_size
        if block_tables.shape[1] * cache.block_size < num_keys:
            raise ConfigError(
                f"block_tables cover {block_tables.shape[1] * cache.block_size} positions; "
                f"num_keys is {num_keys}: pad each table to cover the longest context plus "
                "one block"
            )
        device = anchor_ids.device
        ids = torch.full((b, s), c.mask_token_id, dtype=torch.int64, device=device)
        ids[:, 0] = anchor_ids
        x = self.shared.embed_tokens(ids.view(-1)).view(b, s, -1)
        if c.input_embedding_scale != 1.0:
            x = x * c.input_embedding_scale
        positions = anchor_positions[:, None] + torch.arange(s, device=device)  # [B, S]
        block = cache_rows(block_tables, positions, cache.block_size).view(-1)
        if self.reads_paged(cache):
            rows = BlockRows(
                block=block,
                keys=None,
                masks=(),
                context_lens=(anchor_positions + s).to(torch.int32),
                page_tables=block_tables.to(torch.int32),
            )
        else:
            key_positions = torch.arange(num_keys, device=device).expand(b, num_keys)
            masks = {
                w: block_visibility(anchor_positions, s, num_keys, window=w, is_causal=c.is_causal)
                for w in set(c.sliding_windows)
            }
            rows = BlockRows(
                block=block,
                keys=cache_rows(block_tables, key_positions, cache.block_size),
                masks=tuple(masks[w] for w in c.sliding_windows),
            )
        rope = self.rotary_emb(positions.view(-1))
        for layer in self.layers:
            x = layer(x, rope, cache, rows)
        rows_out = self.norm(x if c.is_shifted else x[:, 1:])
        return BlockDraft(rows_out, self.compute_logits(rows_out))

    def compute_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [B, n, hidden] -> [B, n, V] fp32 through the target's LM head, with the
        drafter's output multiplier and soft cap; padded ids stay -inf."""
        c, lm_head = self.config, self.shared.lm_head
        logits = lm_head(rows.reshape(-1, rows.shape[-1])).view(*rows.shape[:2], -1)
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.final_logit_softcapping is not None:
            cap = c.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
            logits[..., lm_head.num_real_tokens :] = float("-inf")
        return logits

    @torch.inference_mode()
    def draft_tokens(
        self, draft: BlockDraft, anchor_ids: torch.Tensor, pick: Pick = pick_argmax
    ) -> ChainedDraft:
        """The draft tokens [B, n] of a proposal: each row's pick of its logits (DFlash), the
        selector's path (DFlash2) or the Markov chain (DSpark), with the scores they were picked
        from (the drafter's q, for rejection sampling)."""
        if self.candidate_selector is not None:
            return self.candidate_selector.select(draft.hidden, draft.logits, anchor_ids, pick)
        if self.markov_head is not None:
            return self.markov_head.chain(draft.logits, anchor_ids, pick)
        b, n, vocab = draft.logits.shape
        tokens = pick(draft.logits.reshape(b * n, vocab)).view(b, n)
        return ChainedDraft(tokens, draft.logits, None)

    @torch.inference_mode()
    def confidence_logits(
        self, draft: BlockDraft, tokens: torch.Tensor, anchor_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """DSpark: per draft row, the logit of its acceptance given the rows before were
        accepted ([B, n] fp32; sigmoid gives the probability); None without a confidence head."""
        head = self.confidence_head
        if head is None:
            return None
        features = draft.hidden
        if self.markov_head is not None and self.config.confidence_with_markov:
            prev = torch.cat([anchor_ids[:, None], tokens[:, :-1]], dim=1)
            features = torch.cat([features, self.markov_head.embed_previous(prev)], dim=-1)
        return head(features)
