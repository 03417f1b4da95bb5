"""The verify forward of a step that drafts: its layout, acceptance and roll-back points.

A decode row with lookahead tokens (`ScheduledSeq.num_lookahead_tokens`) gets up to that many
drafts from the `Drafter`. All decode rows of the step then run as one packed verify forward:
row (b, j) feeds sequence b's token at position num_cached + j (its input token at j = 0, its
j-th draft after), as a decode row of its own (`VerifyLayout`): attention reads its own context
length, and each Gated-DeltaNet layer runs the decode kernels position after position. So every
row computes what a one-token step would, bit for bit under `deterministic`, and greedy output
is the output without speculation.

Acceptance: the target draws a token at every row with the sampler as a decode step would draw
it there (same filters, same per-position seed), and draft j is accepted while it equals the
token drawn at the row before it. The tokens emitted are the accepted drafts and the token drawn
where the first rejected draft stood (or after the last draft): each is a draw from the target's
distribution given the tokens before it, so sampled output keeps that distribution, and a seeded
request gets the tokens it gets without speculation. Against rejection sampling
(`rejection_sampler`) this accepts a deterministic draft (n-gram, greedy MTP) with the same
probability, p(draft).

Roll-back, by keeping the state after each verified position: after position j every sequence
with a later position copies its conv and recurrent state to a roll-back row (`snapshot_slots`,
the runner's `spec_state_rows`); a sequence that accepted a < n drafts then copies row (a) back
into its slot. KV needs nothing here: rows past the accepted ones sit beyond the context length
the next step reads, and the scheduler frees their blocks. The copies cost n state copies per
verified sequence and step (plus one on rejection) against the alternative, re-running the
accepted tokens through every GDN layer, which needs the layer inputs of the whole stack kept
and a second pass over the weights of those layers per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout, host_to_device
from sparkinfer.scheduler.batch import SampledToken, ScheduledSeq, SpecOutcome


@dataclass(frozen=True)
class VerifyRows:
    """The verify forward's rows: row r is position `row_positions[r]` of `row_seqs[r]`."""

    row_seqs: tuple[ScheduledSeq, ...]
    row_positions: tuple[int, ...]
    row_index: dict[tuple[int, int], int]  # (id of the seq, position) -> row
    drafts: dict[int, list[int]]  # id of the seq -> its drafts
    snapshot_rows: dict[tuple[int, int], int]  # (id of the seq, position) -> roll-back row
    num_positions: dict[int, int]  # id of the seq -> positions its state ran through


def layout_verify(
    seqs: Sequence[ScheduledSeq], drafts: Sequence[list[int]], snapshot_rows: Sequence[int]
) -> tuple[VerifyRows, list[tuple[int, int]]]:
    """Order the rows position-major, sequences with more drafts first -> the rows and each
    position's (start, end) rows."""
    order = sorted(range(len(seqs)), key=lambda i: -len(drafts[i]))
    max_drafts = len(drafts[order[0]]) if order else 0
    max_seqs = len(snapshot_rows) // max(1, max_drafts) if max_drafts else 0
    row_seqs: list[ScheduledSeq] = []
    row_positions: list[int] = []
    row_index: dict[tuple[int, int], int] = {}
    snapshots: dict[tuple[int, int], int] = {}
    bounds: list[tuple[int, int]] = []
    for j in range(max_drafts + 1):
        start = len(row_seqs)
        for rank, i in enumerate(order):
            if len(drafts[i]) < j:
                break
            row_index[(id(seqs[i]), j)] = len(row_seqs)
            row_seqs.append(seqs[i])
            row_positions.append(j)
            if j < len(drafts[i]):  # a later position follows: keep the state after this one
                assert rank < max_seqs, "more verified sequences than roll-back rows"
                snapshots[(id(seqs[i]), j)] = snapshot_rows[j * max_seqs + rank]
        bounds.append((start, len(row_seqs)))
    rows = VerifyRows(
        tuple(row_seqs),
        tuple(row_positions),
        row_index,
        {id(s): d for s, d in zip(seqs, drafts, strict=True)},
        snapshots,
        {id(s): len(d) + 1 for s, d in zip(seqs, drafts, strict=True)},
    )
    return rows, bounds


def verify_batch(
    rows: VerifyRows,
    bounds: Sequence[tuple[int, int]],
    *,
    caches: ModelCaches,
    block_size: int,
    device: torch.device,
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
    snapshot_slots: list[torch.Tensor | None] = []
    for j, (start, end) in enumerate(bounds):
        keys = [(id(rows.row_seqs[r]), j) for r in range(start, end)]
        dsts = [rows.snapshot_rows[k] for k in keys if k in rows.snapshot_rows]
        snapshot_slots.append(
            host_to_device(torch.tensor(dsts, dtype=torch.int64), device) if dsts else None
        )
    batch.verify = VerifyLayout(tuple(bounds), tuple(snapshot_slots))
    return batch


def verify_input_ids(
    rows: VerifyRows, sources: dict[int, int | None]
) -> tuple[list[int], list[int]]:
    """Host input ids of the verify rows (0 where the input is in flight) and the in-flight row
    feeding each (-1 where known); `sources`: id of the seq -> its in-flight source row."""
    ids: list[int] = []
    feeds: list[int] = []
    for seq, j in zip(rows.row_seqs, rows.row_positions, strict=True):
        source = sources.get(id(seq)) if j == 0 else None
        if j > 0:
            ids.append(rows.drafts[id(seq)][j - 1])
        else:
            ids.append(0 if seq.is_input_inflight else seq.req.token_ids[seq.num_cached_tokens])
        feeds.append(-1 if source is None else source)
    return ids, feeds


@dataclass(frozen=True)
class Accepted:
    """What acceptance decided: the samples in step order, each verified request's outcome, the
    (roll-back row, slot) copies to make, and each row's accepted-row count per sequence."""

    samples: list[tuple[ScheduledSeq, SampledToken]]
    outcomes: dict[str, SpecOutcome]
    restores: list[tuple[int, int]]
    num_rows: dict[int, int]  # id of the seq -> rows kept (accepted drafts + 1)


def accept(rows: VerifyRows, drawn: Sequence[SampledToken]) -> Accepted:
    """Accept each sequence's drafts while they equal the target's draw at the row before."""
    samples: list[tuple[ScheduledSeq, SampledToken]] = []
    outcomes: dict[str, SpecOutcome] = {}
    restores: list[tuple[int, int]] = []
    num_rows: dict[int, int] = {}
    seen: set[int] = set()
    for seq in rows.row_seqs:
        if id(seq) in seen:
            continue
        seen.add(id(seq))
        drafts = rows.drafts[id(seq)]
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
        if num_accepted + 1 < rows.num_positions[id(seq)]:  # its state ran past the last kept
            restores.append((rows.snapshot_rows[(id(seq), num_accepted)], _slot(seq)))
    return Accepted(samples, outcomes, restores, num_rows)


def _slot(seq: ScheduledSeq) -> int:
    assert seq.req.state_slot is not None, f"{seq.req.request_id} runs without a state slot"
    return seq.req.state_slot
