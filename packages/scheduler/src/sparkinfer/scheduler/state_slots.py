"""Rows of the recurrent-state pool (conv window + fp32 GDN state), one per running sequence."""

from __future__ import annotations


class StateSlots:
    """Owns which state rows are free. A sequence holds one row from admission to finish.

    A new holder need not clear its row: the first chunk runs with has_initial_state False,
    so the kernels start from zeros and overwrite it.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots is {num_slots}; it must be >= 1")
        self.num_slots = num_slots
        # Lowest rows first, so a light load touches the same few rows.
        self._free = list(range(num_slots - 1, -1, -1))
        self._is_used = [False] * num_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_used_slots(self) -> int:
        return self.num_slots - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_slots / self.num_slots

    def allocate(self) -> int:
        """Take a free row."""
        if not self._free:
            raise RuntimeError(
                f"all {self.num_slots} state slots are in use: check num_free_slots first"
            )
        slot = self._free.pop()
        self._is_used[slot] = True
        return slot

    def free(self, slot: int) -> None:
        """Return `slot` to the pool."""
        assert self._is_used[slot], f"state slot {slot} freed twice"
        self._is_used[slot] = False
        self._free.append(slot)
