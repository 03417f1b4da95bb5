"""Vision tower outputs kept for reuse, keyed by each image's or video's content hash.

A chat that sends the same image every turn would otherwise run the tower on it every turn. The
runner keeps each item's output rows (on the device) here, least recently used first out, within
a budget of bytes (`SchedulerConfig.vision_cache_bytes`); an item larger than the whole budget is
not kept. Only rows the tower produced are ever put in, so a request refused at the edge (corrupt
or oversized media) leaves nothing behind.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class VisionCache:
    """Tower rows by content hash, bounded in bytes (0 bytes: off)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"vision cache budget is {max_bytes} bytes; expected >= 0 (0: off)")
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._rows: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, content_hash: str) -> torch.Tensor | None:
        """The rows of an item seen before (now the most recently used), else None."""
        rows = self._rows.get(content_hash)
        if rows is not None:
            self._rows.move_to_end(content_hash)
        return rows

    def put(self, content_hash: str, rows: torch.Tensor) -> None:
        """Keep `rows` (a tensor of its own, not a view of a larger one) for `content_hash`,
        evicting the least recently used items until it fits; one larger than the budget is
        dropped."""
        size = rows.numel() * rows.element_size()
        if size > self.max_bytes or content_hash in self._rows:
            return
        while self.num_bytes + size > self.max_bytes:
            _, old = self._rows.popitem(last=False)
            self.num_bytes -= old.numel() * old.element_size()
        self._rows[content_hash] = rows
        self.num_bytes += size

    def clear(self) -> None:
        self._rows.clear()
        self.num_bytes = 0
