"""Rejection sampling of drafts drawn from a draft distribution q (Leviathan et al., Chen et al.):
the emitted tokens are distributed as the target p, whatever q is.

Draft j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the
token comes from the residual max(0, p_j - q_j), renormalised; after n accepted drafts the next
one comes from p_n. A deterministic drafter (prompt lookup, greedy MTP) has q one-hot, so draft
j is accepted with probability p_j(d_j) and a rejection draws from p_j without d_j: the same
acceptance as drawing from p_j and comparing (`speculative.verify.accept`, which also keeps seeded
requests' tokens), so the verify step uses that; this module serves drafters that sample their
drafts (a block drafter at temperature > 0) and is the reference the statistical tests check.
"""

from __future__ import annotations

import torch
from sparkinfer.scheduler.sampler import host_list


def rejection_sample(
    target_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    *,
    generator: torch.Generator | None = None,
) -> tuple[int, list[int]]:
    """One sequence's verify.

    Args:
        target_probs: [n + 1, vocab] fp32, row j the target's distribution at draft j's position
            (row n: after the last draft).
        draft_ids: [n] int64 drafts.
        draft_probs: [n, vocab] fp32 the distributions the drafts were drawn from; None for a
            deterministic drafter (one-hot at each draft).
        generator: the source of the uniform and categorical draws.

    Returns:
        (accepted drafts a, the a + 1 tokens to emit: the accepted drafts, then the token drawn
        from the residual at the first rejection, or from row n when every draft was accepted).
    """
    n = int(draft_ids.shape[0])
    ids: list[int] = host_list(draft_ids)
    device = target_probs.device
    for j in range(n):
        p = target_probs[j]
        q = (
            torch.nn.functional.one_hot(draft_ids[j], p.shape[0]).to(p.dtype)
            if draft_probs is None
            else draft_probs[j]
        )
        d = ids[j]
        ratio = float(p[d]) / max(float(q[d]), 1e-30)
        u = float(torch.rand((), generator=generator, device=device))
        if u < min(1.0, ratio):
            continue
        residual = (p - q).clamp(min=0)
        total = float(residual.sum())
        residual = p if total <= 0 else residual / total
        token = int(torch.multinomial(residual, 1, generator=generator))
        return j, [*ids[:j], token]
    bonus = int(torch.multinomial(target_probs[n], 1, generator=generator))
    return n, [*ids, bonus]
