"""The verify forward of a step that drafts: its layout, acceptance and what its states keep.

A decode row with lookahead tokens (`ScheduledSeq.num_lookahead_tokens`) gets up to that many
drafts from the `Drafter`. All decode rows of the step then run as one packed verify forward:
row (b, j) feeds sequence b's token at position num_cached + j (its input token at j = 0, its
j-th draft after), as a decode row of its own (`VerifyLayout`): attention reads its own context
length, and each Gated-DeltaNet layer runs a sequence's positions one after the other with the
decode kernels' per-token arithmetic. So every row computes what a one-token step would, bit for
bit under `deterministic`, and greedy output is the output without speculation.

Acceptance: the target draws a token at every row with the sampler as a decode step would draw
it there (same filters, same per-position seed), and draft j is accepted while it equals the
token drawn at the row before it. The tokens emitted are the accepted drafts and the token drawn
where the first rejected draft stood (or after the last draft): each is a draw from the target's
distribution given the tokens before it, so sampled output keeps that distribution, and a seeded
request gets the tokens it gets without speculation. Against rejection sampling
(`rejection_sampler`) this accepts a deterministic draft (n-gram, greedy MTP) with the same
probability, p(draft).

Roll-back without copying state: the Gated-DeltaNet layers verify each sequence's positions in
one launch that reads the state in its slot and never writes it (the layers keep what the rows
fed them in a small `VerifyStash` per layer), and after acceptance the step has the model apply
each sequence's kept positions, the input token and the accepted drafts, to the state in its
slot (`commit_verify` with `Accepted.num_kept`), with the decode kernels' per-token arithmetic:
the state is then what that many one-token steps leave, bit for bit. KV needs nothing: rows
past the accepted ones sit beyond the context length the next step reads, and the scheduler
frees their blocks. No state row is kept per draft, so every running sequence may verify.

State traffic per sequence and step at 27B (48 GDN layers of a 3.1 MB fp32 recurrent state,
151 MB in all; k = 3 drafts, 4 positions), before: each position read and wrote the state (4 x
302 MB), the 3 positions with a later one copied it to a roll-back row (3 x 302 MB) and a
rejection copied one back (302 MB): about 2.4 GB. Now: the verify reads it once (151 MB) and the
commit reads and writes it once (302 MB), 453 MB, plus the stash, 2 MB a row written by the
verify and read by the commit (8 MB a sequence at 4 positions): about 0.47 GB, a fifth. The
conv windows (0.06 MB a layer, 3 MB in all) follow the same pattern.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout, host_to_device
from sparkinfer.scheduler.batch import SampledToken, ScheduledSeq, SpecOutcome
from sparkinfer.scheduler.speculative.drafter import Drafts


@dataclass(frozen=True)
class VerifyRows:
    """The verify forward's rows: row r is position `row_positions[r]` of `row_seqs[r]`;
    `seq_order` is the order of the sequences in the forward's `VerifyLayout` (a graph's:
    its rank; an eager forward's: more drafts first)."""

    row_seqs: tuple[ScheduledSeq, ...]
    row_positions: tuple[int, ...]
    row_index: dict[tuple[int, int], int]  # (id of the seq, position) -> row
    num_drafts: dict[int, int]  # id of the seq -> how many drafts it verifies
    seq_order: tuple[ScheduledSeq, ...]


def layout_verify(seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> VerifyRows:
    """Order the rows position-major, sequences with more drafts first (the drafts' counts
    alone lay them out: their ids may still be on the device)."""
    order = sorted(range(len(seqs)), key=lambda i: -num_drafts[i])
    max_drafts = num_drafts[order[0]] if order else 0
    row_seqs: list[ScheduledSeq] = []
    row_positions: list[int] = []
    row_index: dict[tuple[int, int], int] = {}
    for j in range(max_drafts + 1):
        for i in order:
            if num_drafts[i] < j:
                break
            row_index[(id(seqs[i]), j)] = len(row_seqs)
            row_seqs.append(seqs[i])
            row_positions.append(j)
    return VerifyRows(
        tuple(row_seqs),
        tuple(row_positions),
        row_index,
        {id(s): n for s, n in zip(seqs, num_drafts, strict=True)},
        tuple(seqs[i] for i in order),
    )


def verify_layout(rows: VerifyRows, device: torch.device) -> VerifyLayout:
    """The model's view of the rows: each sequence's row per position, its state slot."""
    num_positions = max((n + 1 for n in rows.num_drafts.values()), default=0)
    seq_rows = [
        [rows.row_index.get((id(s), j), -1) for j in range(num_positions)] for s in rows.seq_order
    ]
    ints = torch.tensor(seq_rows, dtype=torch.int64).reshape(len(seq_rows), num_positions)
    slots = torch.tensor([_slot(s) for s in rows.seq_order], dtype=torch.int64)
    return VerifyLayout(host_to_device(ints, device), host_to_device(slots, device))


def verify_batch(
    rows: VerifyRows, *, caches: ModelCaches, block_size: int, device: torch.device
) -> ForwardBatch:
    """The verify forward's batch: one decode row per (sequence, position)."""
    cached = [
        s.num_cached_tokens + j for s, j in zip(rows.row_seqs, rows.row_positions, strict=True)
    ]
    positions = [c + s.req.rope_delta for c, s in zip(cached, rows.row_seqs, strict=True)]
    batch = ForwardBatch.build(
        [1] * len(cached),
        cached,
        [s.req.block_ids for s in rows.row_seqs],
        [_slot(s) for s in rows.row_seqs],
        caches=caches,
        block_size=block_size,
        device=device,
        positions=host_to_device(torch.tensor(positions, dtype=torch.int64), device),
    )
    batch.verify = verify_layout(rows, device)
    return batch


def verify_input_ids(
    rows: VerifyRows, sources: dict[int, int | None], drafts: Drafts, index: dict[int, int]
) -> tuple[list[int], list[int], list[int]]:
    """Host input ids of the verify rows (0 where the input is in flight or a draft still on the
    device), the in-flight row feeding each (-1 where known) and the draft feeding each
    (`Drafts.feed_index`); `sources`: id of the seq -> its in-flight source row; `index`: id
    of the seq -> its row in `drafts`."""
    host = None if drafts.is_on_device else drafts.host()
    ids: list[int] = []
    feeds: list[int] = []
    draft_feeds: list[int] = []
    for seq, j in zip(rows.row_seqs, rows.row_positions, strict=True):
        source = sources.get(id(seq)) if j == 0 else None
        i = index[id(seq)]
        if j == 0:
            ids.append(0 if seq.is_input_inflight else seq.req.token_ids[seq.num_cached_tokens])
            draft_feeds.append(-1)
        elif host is not None:
            ids.append(host[i][j - 1])
            draft_feeds.append(-1)
        else:
            ids.append(0)
            draft_feeds.append(drafts.feed_index(i, j - 1))
        feeds.append(-1 if source is None else source)
    return ids, feeds, draft_feeds


@dataclass(frozen=True)
class Accepted:
    """What acceptance decided: the samples in step order, each verified request's outcome and
    each sequence's kept rows (the positions its state commits)."""

    samples: list[tuple[ScheduledSeq, SampledToken]]
    outcomes: dict[str, SpecOutcome]
    num_rows: dict[int, int]  # id of the seq -> rows kept (accepted drafts + 1)

    def num_kept(self, order: Sequence[ScheduledSeq], num_seqs: int) -> list[int]:
        """Kept rows per sequence of a `VerifyLayout` of num_seqs sequences (those past
        `order`, padding, keep none)."""
        kept = [self.num_rows[id(s)] for s in order]
        return kept + [0] * (num_seqs - len(kept))


def accept(
    rows: VerifyRows, drafts_of: dict[int, list[int]], drawn: Sequence[SampledToken]
) -> Accepted:
    """Accept each sequence's drafts (`drafts_of`: id of the seq -> its drafts) while they equal
    the target's draw at the row before."""
    samples: list[tuple[ScheduledSeq, SampledToken]] = []
    outcomes: dict[str, SpecOutcome] = {}
    num_rows: dict[int, int] = {}
    seen: set[int] = set()
    for seq in rows.row_seqs:
        if id(seq) in seen:
            continue
        seen.add(id(seq))
        drafts = drafts_of[id(seq)]
        num_accepted = 0
        while True:
            token = drawn[rows.row_index[(id(seq), num_accepted)]]
            samples.append((seq, token))
            if num_accepted == len(drafts) or drafts[num_accepted] != token.token_id:
                break
            num_accepted += 1
        num_rows[id(seq)] = num_accepted + 1
        if drafts:
            outcomes[seq.req.request_id] = SpecOutcome(len(drafts), num_accepted)
    return Accepted(samples, outcomes, num_rows)


def num_kept_on_device(
    rows: VerifyRows,
    drafts: Drafts,
    index: dict[int, int],
    order: Sequence[ScheduledSeq],
    num_seqs: int,
    drawn: torch.Tensor,
) -> torch.Tensor:
    """`accept`'s kept rows per sequence of a `VerifyLayout` of num_seqs sequences (`order`
    first, padding after: none kept), [num_seqs] int64 on the device from the draws still there
    (drawn [>= rows] int64, in the rows' order), so the commit follows the sampler with no host
    read between: 1 + the leading drafts equal to the draw at the row before each. `index`: id
    of the seq -> its row in `drafts` (ids on the host, or fed from the device's)."""
    k = max(rows.num_drafts.values(), default=0)
    host = None if drafts.is_on_device else drafts.host()
    # [draft ids (host), draft feeds (device ids), the draw's row, draft counted, real] per
    # (sequence, draft): -1 or 0 where none
    staged = [[[-1] * k for _ in range(num_seqs)] for _ in range(2)]
    staged += [[[0] * k for _ in range(num_seqs)] for _ in range(3)]
    for b, seq in enumerate(order):
        i = index[id(seq)]
        staged[4][b] = [1] * k
        for a in range(rows.num_drafts[id(seq)]):
            if host is not None:
                staged[0][b][a] = host[i][a]
            else:
                staged[1][b][a] = drafts.feed_index(i, a)
            staged[2][b][a] = rows.row_index[(id(seq), a)]
            staged[3][b][a] = 1
    assert k > 0, "a verify has drafts"
    dev = host_to_device(torch.tensor(staged, dtype=torch.int64), drawn.device)
    ids = drafts.merge_into(dev[0].reshape(-1), dev[1].reshape(-1)).reshape(num_seqs, k)
    equal = (ids == drawn[dev[2]]) & (dev[3] > 0)
    return dev[4][:, 0] + equal.long().cumprod(dim=1).sum(dim=1)


def _slot(seq: ScheduledSeq) -> int:
    assert seq.req.state_slot is not None, f"{seq.req.request_id} runs without a state slot"
    return seq.req.state_slot
