"""How the runner splits its cache budget between GDN state slots and paged KV blocks."""

from __future__ import annotations

from dataclasses import dataclass

from sparkinfer.model.cache_spec import CacheSpec
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.errors import CacheAllocationError


@dataclass(frozen=True)
class CachePlan:
    num_blocks: int
    num_slots: int
    num_snapshots: int = 0  # state rows after the slots, for the prefix cache
    num_verify_rows: int = 0  # rows of the GDN layers' verify stashes (speculation)


def plan_cache(
    spec: CacheSpec, config: SchedulerConfig, *, budget_bytes: int, cap_blocks: bool
) -> CachePlan:
    """Split `budget_bytes` between state slots (up to max_num_seqs) and KV blocks.

    Explicit sizes in `config` win. State gets at most half the budget, so a small GPU still
    keeps KV room; `cap_blocks` stops at what max_num_seqs full-length sequences could use. The
    prefix cache's `prefix_cache_snapshots` state rows and the verify stashes' rows
    (`num_verify_rows`, about 2 MB a row at 27B) come out of the budget first.
    """
    state_bytes = max(1, spec.state_bytes_per_slot())
    num_snapshots = config.prefix_cache_snapshots
    num_verify_rows = config.num_verify_rows
    budget_bytes -= num_snapshots * state_bytes + num_verify_rows * spec.verify_bytes_per_row()
    block_bytes = max(1, spec.kv_bytes_per_token() * config.block_size)
    num_slots = config.num_state_slots
    if num_slots is None:
        num_slots = min(config.max_num_seqs, budget_bytes // 2 // state_bytes)
    num_blocks = config.num_kv_blocks
    if num_blocks is None:
        num_blocks = (budget_bytes - num_slots * state_bytes) // block_bytes
        if cap_blocks:
            num_blocks = min(num_blocks, config.max_num_seqs * config.max_blocks_per_seq)
    if num_slots < 1 or num_blocks < 1:
        raise CacheAllocationError(
            f"{budget_bytes / 2**20:.0f} MiB for caches (after {num_snapshots} prefix-cache "
            f"snapshots and {num_verify_rows} verify rows) gives {num_slots} state slots "
            f"({state_bytes / 2**20:.1f} MiB each) and "
            f"{num_blocks} KV blocks ({block_bytes / 2**20:.2f} MiB each); at least one of each "
            "is needed: raise gpu_memory_utilization (or cpu_cache_bytes), set num_kv_blocks / "
            "num_state_slots, or lower prefix_cache_snapshots"
        )
    return CachePlan(
        num_blocks=num_blocks,
        num_slots=num_slots,
        num_snapshots=num_snapshots,
        num_verify_rows=num_verify_rows,
    )
