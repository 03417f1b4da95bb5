"""KV pages: a free list and a reference count per block (plain Python, no torch)."""

from __future__ import annotations

from collections import deque


class BlockManager:
    """Owns which KV blocks are free and how many block tables hold each one.

    Reference counts let a block be shared (a prefix hit, a forked sequence); it returns to the
    free list when its last holder frees it.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks {num_blocks} and block_size {block_size} must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free blocks (reference count 1 each)."""
        if num_blocks > len(self._free):
            raise RuntimeError(
                f"asked for {num_blocks} KV blocks with {len(self._free)} free: "
                "check can_allocate first"
            )
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        for b in blocks:
            self._ref_counts[b] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        """Add one holder to each of `blocks`."""
        for b in blocks:
            assert self._ref_counts[b] > 0, f"block {b} is free and cannot be shared"
            self._ref_counts[b] += 1

    def free(self, blocks: list[int]) -> None:
        """Drop one holder from each of `blocks`; blocks nobody holds return to the free list."""
        for b in blocks:
            assert self._ref_counts[b] > 0, f"block {b} freed twice"
            self._ref_counts[b] -= 1
            if self._ref_counts[b] == 0:
                self._free.append(b)

    def ref_count(self, block: int) -> int:
        return self._ref_counts[block]
