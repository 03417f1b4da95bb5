"""The engine config of an offline run (bench and lab), built in one place.

A run's config is `SchedulerConfig`'s defaults (the server's too), the room its shapes need
(`max_num_seqs`, `max_model_len`) and the engine flags its parser declares (`ENGINE_FLAGS`: a
flag's dest → the field it sets); a flag the parser does not declare leaves the default. What
a run sets beyond that (a drafter, a block size) it sets with `dataclasses.replace`.
"""

from __future__ import annotations

import argparse

from sparkinfer.scheduler.config import SchedulerConfig

# The engine flags of bench and lab parsers: dest -> SchedulerConfig field.
ENGINE_FLAGS: dict[str, str] = {
    "max_batched_tokens": "max_num_batched_tokens",
    "enforce_eager": "enforce_eager",
    "prefill_graph_tokens": "prefill_graph_tokens",
    "overlap_steps": "overlap_steps",
    "dependent_launch": "dependent_launch",
    "deterministic": "deterministic",
    "prefix_cache_snapshots": "prefix_cache_snapshots",
}


def offline_config(
    args: argparse.Namespace | None, *, max_num_seqs: int, max_model_len: int
) -> SchedulerConfig:
    """The config of a run whose widest step holds `max_num_seqs` sequences and whose longest
    sequence is `max_model_len` tokens, with the engine flags `args` carries (None: none)."""
    flags = vars(args) if args is not None else {}
    knobs = {field: flags[dest] for dest, field in ENGINE_FLAGS.items() if dest in flags}
    return SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len, **knobs)
