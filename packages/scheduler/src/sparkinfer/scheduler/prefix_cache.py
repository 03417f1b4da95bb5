"""Prompt prefixes kept for reuse: their KV blocks and a snapshot of their GDN state.

A Qwen3.8 sequence's state is its KV pages plus the conv and recurrent state of 48 GDN layers,
which is not paged and which every later token overwrites in place. So a prefix can be reused
only where that state was copied aside: at a checkpoint, a multiple of `alignment` tokens
(`SchedulerConfig.prefix_alignment`: whole KV blocks, and a cut the deterministic mode allows).

The scheduler makes a long prompt end prefill chunks at checkpoints (its last one, and the one
where it parts from a cached prefix, which two prompts share and a third may); after such a step
the runner copies the request's state row to a snapshot row, and the entry keeps the prefix's
tokens, one more hold on each of its KV blocks and the snapshot. A later prompt that starts with an
entry's tokens and has more after them starts from the longest such entry: its block table
begins with the entry's blocks, the snapshot is copied into its state row and its prefill resumes
at the checkpoint. Nothing writes a cached block again: it holds positions before the checkpoint.

Entries go least recently used first: when a snapshot row is needed for a new one, and when the
KV blocks run short (before any running request is preempted). Plain Python, no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from sparkinfer.scheduler.block_manager import BlockManager


@dataclass(frozen=True)
class PrefixEntry:
    """A cached prefix: `tokens` (a multiple of the alignment), its KV `blocks`, and the
    state-pool row holding the GDN state after its last token."""

    tokens: tuple[int, ...]
    blocks: tuple[int, ...]
    snapshot_row: int


class PrefixCache:
    """Entries keyed by (length, chained hash of the aligned pieces), in recency order."""

    def __init__(self, blocks: BlockManager, snapshot_rows: Sequence[int], alignment: int) -> None:
        if alignment % blocks.block_size:
            raise ValueError(
                f"prefix alignment {alignment} is not a multiple of the block size "
                f"{blocks.block_size}"
            )
        self.blocks = blocks
        self.alignment = alignment
        self.num_rows = len(snapshot_rows)
        self._free_rows = list(reversed(snapshot_rows))
        self._entries: OrderedDict[tuple[int, int], PrefixEntry] = OrderedDict()

    @property
    def is_enabled(self) -> bool:
        return self.num_rows > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token_ids: Sequence[int]) -> PrefixEntry | None:
        """The longest entry whose tokens start `token_ids` and leave at least one token after
        them (the step after a hit must compute something to sample from)."""
        if not self._entries:
            return None
        keys = self._keys(token_ids, len(token_ids) - 1)
        for key in reversed(keys):
            entry = self._entries.get(key)
            if entry is not None and tuple(token_ids[: key[0]]) == entry.tokens:
                self._entries.move_to_end(key)
                return entry
        return None

    def longest_shared(self, token_ids: Sequence[int], max_len: int) -> int:
        """Tokens (a multiple of the alignment, at most `max_len`) that `token_ids` shares with
        the start of some entry, whether or not an entry ends there."""
        best, a = 0, self.alignment
        for entry in self._entries.values():
            end = min(len(entry.tokens), max_len) // a * a
            n = best
            if tuple(token_ids[:n]) != entry.tokens[:n]:
                continue
            while n < end and tuple(token_ids[n : n + a]) == entry.tokens[n : n + a]:
                n += a
            best = n
        return best

    def contains(self, token_ids: Sequence[int]) -> bool:
        """Whether `token_ids` (a multiple of the alignment long) is cached already."""
        keys = self._keys(token_ids, len(token_ids))
        return bool(keys) and keys[-1][0] == len(token_ids) and keys[-1] in self._entries

    def insert(self, token_ids: Sequence[int], blocks: Sequence[int]) -> PrefixEntry | None:
        """Keep `token_ids` (a multiple of the alignment) with its first KV blocks; returns the
        entry, whose snapshot row the caller fills, or None when no row can be freed."""
        tokens = tuple(token_ids)
        if not tokens or len(tokens) % self.alignment:
            raise ValueError(
                f"a cached prefix has {len(tokens)} tokens; expected a positive multiple of "
                f"{self.alignment}"
            )
        num_blocks = len(tokens) // self.blocks.block_size
        if len(blocks) < num_blocks:
            raise ValueError(f"{len(tokens)} tokens need {num_blocks} blocks, got {len(blocks)}")
        if self.contains(tokens) or (not self._free_rows and not self.evict_one()):
            return None
        entry = PrefixEntry(tokens, tuple(blocks[:num_blocks]), self._free_rows.pop())
        self.blocks.share(list(entry.blocks))
        self._entries[self._keys(tokens, len(tokens))[-1]] = entry
        return entry

    def evict_one(self, keep: PrefixEntry | None = None) -> bool:
        """Drop the least recently used entry other than `keep` (its blocks lose a holder, its
        row is free again); False when there is none."""
        key = next((k for k, e in self._entries.items() if e is not keep), None)
        if key is None:
            return False
        entry = self._entries.pop(key)
        self.blocks.free(list(entry.blocks))
        self._free_rows.append(entry.snapshot_row)
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass

    def _keys(self, token_ids: Sequence[int], max_len: int) -> list[tuple[int, int]]:
        """(length, chained hash) of each aligned prefix of `token_ids` up to `max_len` tokens."""
        keys: list[tuple[int, int]] = []
        digest, a = 0, self.alignment
        for end in range(a, max_len + 1, a):
            digest = hash((digest, tuple(token_ids[end - a : end])))
            keys.append((end, digest))
        return keys
