"""Rejection sampling keeps the target distribution at every emitted position (chi-square)."""

import pytest
import torch
from sparkinfer.scheduler.speculative.rejection_sampler import rejection_sample

VOCAB, NUM_DRAFTS, NUM_TRIALS = 6, 3, 6000
CHI2_DOF5_P001 = 20.52  # the chi-square quantile for 5 degrees of freedom at p = 0.001


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("has_draft_probs", [True, False])
def test_every_emitted_position_follows_the_target(has_draft_probs):
    gen = torch.Generator().manual_seed(0)
    target = torch.softmax(torch.randn(NUM_DRAFTS + 1, VOCAB, generator=gen) * 1.5, dim=-1)
    draft = torch.softmax(torch.randn(NUM_DRAFTS, VOCAB, generator=gen) * 1.5, dim=-1)
    fixed = target[:NUM_DRAFTS].argmax(-1)  # a deterministic drafter's choice
    counts = torch.zeros(2, VOCAB)
    num_accepted = 0
    for _ in range(NUM_TRIALS):
        ids = torch.multinomial(draft, 1, generator=gen).squeeze(1) if has_draft_probs else fixed
        a, tokens = rejection_sample(target, ids, draft if has_draft_probs else None, generator=gen)
        assert len(tokens) == a + 1 and tokens[:a] == ids[:a].tolist()
        num_accepted += a
        for j, t in enumerate(tokens[:2]):
            counts[j, t] += 1
    # Target rows do not depend on earlier tokens here, so position j is distributed as row j.
    assert _chi2(counts[0], target[0]) < CHI2_DOF5_P001
    assert _chi2(counts[1], target[1]) < CHI2_DOF5_P001
    assert 0 < num_accepted < NUM_TRIALS * NUM_DRAFTS


def test_a_draft_the_target_never_draws_is_never_accepted():
    target = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    for seed in range(50):
        a, tokens = rejection_sample(
            target, torch.tensor([0]), None, generator=torch.Generator().manual_seed(seed)
        )
        assert a == 0 and tokens[0] in (1, 2)
