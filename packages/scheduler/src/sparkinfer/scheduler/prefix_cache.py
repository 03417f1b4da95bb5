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

Images and videos: every image's pad tokens have the same id, so a prompt with media is keyed by
`media_key_tokens`, where each pad run stands as its item's content hash (a negative number no
token id can equal). Two prompts share a cached prefix only where their text and their media are
the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from sparkinfer.scheduler.block_manager import BlockManager


@dataclass(frozen=True, eq=False)
class PrefixEntry:
    """A cached prefix: `tokens` (a multiple of the alignment), the chained digest after each of
    its aligned pieces, its KV `blocks`, and the state-pool row holding the GDN state after its
    last token. Entries compare by identity.

    `tokens` is a list, never changed after the entry is made: a hit's confirmation compares the
    prompt's list slice with it directly (a 32K-token prompt's tuple conversion and compare took
    three times as long as the list compare, on the engine thread, before the step's launch).
    """

    tokens: list[int]
    digests: tuple[int, ...]
    blocks: tuple[int, ...]
    snapshot_row: int


def media_key(content_hash: str) -> int:
    """The key every pad token of an item stands as: all of the hash (a hit is confirmed key by
    key, so a shorter key would let two images collide), negative, so never a token id."""
    return -1 - int(content_hash, 16)


def media_key_tokens(
    token_ids: Sequence[int],
    content_hashes: Sequence[str],
    pad_runs: Sequence[tuple[int, int, int]],
) -> list[int]:
    """`token_ids` with each pad run `(start, end, item index)` replaced by its item's key: the
    tokens a prompt with media is cached and looked up by."""
    keys = list(token_ids)
    for start, end, item_idx in pad_runs:
        keys[start:end] = [media_key(content_hashes[item_idx])] * (end - start)
    return keys


class PrefixCache:
    """Entries keyed by the chained digest of their aligned pieces, in recency order.

    A request's digests are computed once and extended as its tokens grow (`digests`); a hit is
    confirmed token by token, since digests are not collision-proof against crafted prompts.
    """

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
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()

    @property
    def is_enabled(self) -> bool:
        return self.num_rows > 0

    def __len__(self) -> int:
        return len(self._entries)

    def digests(self, token_ids: Sequence[int], known: list[int]) -> list[int]:
        """Extend `known` (the digests of `token_ids`' first pieces, computed before) to every
        whole aligned piece of `token_ids`, in place, and return it. Digest i covers the first
        (i + 1) * alignment tokens."""
        a = self.alignment
        digest = known[-1] if known else 0
        for end in range((len(known) + 1) * a, len(token_ids) + 1, a):
            digest = hash((digest, tuple(token_ids[end - a : end])))
            known.append(digest)
        return known

    def lookup(
        self, token_ids: list[int], digests: Sequence[int], confirmed: object = None
    ) -> PrefixEntry | None:
        """The longest entry whose tokens start `token_ids` and leave at least one token after
        them (the step after a hit must compute something to sample from). `confirmed`: an entry
        already checked token by token against these tokens."""
        if not self._entries:
            return None
        for i in reversed(range(min(len(digests), (len(token_ids) - 1) // self.alignment))):
            entry = self._entries.get(digests[i])
            if entry is None or len(entry.tokens) != (i + 1) * self.alignment:
                continue
            if entry is confirmed or token_ids[: len(entry.tokens)] == entry.tokens:
                self._entries.move_to_end(digests[i])
                return entry
        return None

    def longest_shared(self, digests: Sequence[int], max_len: int) -> int:
        """Tokens (a multiple of the alignment, at most `max_len`) whose digests match the start
        of some entry's, whether or not an entry ends there."""
        best = 0
        for entry in self._entries.values():
            n, end = 0, min(len(entry.digests), len(digests), max_len // self.alignment)
            while n < end and entry.digests[n] == digests[n]:
                n += 1
            best = max(best, n * self.alignment)
        return best

    def contains(self, digests: Sequence[int], num_tokens: int) -> bool:
        """Whether the first `num_tokens` (a positive multiple of the alignment) of the tokens
        whose digests these are are cached already."""
        i = num_tokens // self.alignment - 1
        entry = self._entries.get(digests[i]) if 0 <= i < len(digests) else None
        return entry is not None and len(entry.tokens) == num_tokens

    def insert(
        self, token_ids: Sequence[int], digests: Sequence[int], blocks: Sequence[int]
    ) -> PrefixEntry | None:
        """Keep `token_ids` (a multiple of the alignment; `digests` at least covers them) with
        its first KV blocks; returns the entry, whose snapshot row the caller fills, or None when
        it is cached already or no row can be freed."""
        tokens = list(token_ids)
        num_pieces = len(tokens) // self.alignment
        if not tokens or len(tokens) % self.alignment or len(digests) < num_pieces:
            raise ValueError(
                f"a cached prefix has {len(tokens)} tokens and {len(digests)} digests; expected a "
                f"positive multiple of {self.alignment} tokens and a digest for each piece"
            )
        num_blocks = len(tokens) // self.blocks.block_size
        if len(blocks) < num_blocks:
            raise ValueError(f"{len(tokens)} tokens need {num_blocks} blocks, got {len(blocks)}")
        chain = tuple(digests[:num_pieces])
        if chain[-1] in self._entries or (not self._free_rows and not self.evict_one()):
            return None
        entry = PrefixEntry(tokens, chain, tuple(blocks[:num_blocks]), self._free_rows.pop())
        self.blocks.share(list(entry.blocks))
        self._entries[chain[-1]] = entry
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
