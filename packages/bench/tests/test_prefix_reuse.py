"""The offline mode's prefix-reuse rows on the CPU: the scheduler tests' tiny model in a real
engine with the prefix cache on."""

import sys
from pathlib import Path

from sparkinfer.bench import prefix_reuse
from sparkinfer.bench.prefix_reuse import PrefixReuseRow
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine


def test_requests_after_the_first_reuse_the_shared_prefix():
    sys.path.insert(0, str(Path(__file__).parents[2] / "scheduler" / "tests"))
    from scheduler_testing import build_tiny_model

    config = SchedulerConfig(
        block_size=16, max_model_len=512, max_num_batched_tokens=512, max_num_seqs=1,
        prefix_cache_snapshots=2, prefix_cache_min_tokens=128,
    )  # fmt: skip
    engine = Engine.from_model(build_tiny_model(), config)
    try:
        rows = prefix_reuse.measure_prefix_reuse(
            engine, prefix_len=300, suffix_len=20, num_requests=3, vocab=250, seed=0
        )
    finally:
        engine.shutdown()
    # 320-token prompts: the first ends a chunk at 256 (the last checkpoint before its final
    # token) and keeps that state; the next two start there.
    assert [(r.request, r.prompt_len, r.prefix_len) for r in rows] == [
        (1, 320, 0), (2, 320, 300), (3, 320, 300)
    ]  # fmt: skip
    assert [r.cached_tokens for r in rows] == [0, 256, 256]
    assert all(r.ttft_ms > 0 for r in rows)
    assert prefix_reuse.gate(rows).is_passed


def test_table_and_gate_report_a_miss():
    rows = [PrefixReuseRow(1, 4128, 0, 0, 400.0), PrefixReuseRow(2, 4128, 4096, 0, 400.0)]
    table = prefix_reuse.table(rows, snapshots=4)
    assert table.rows[1][3:] == [0, 400.0, 1.0]
    gate = prefix_reuse.gate(rows)
    assert not gate.is_passed and "[2]" in gate.detail


def test_the_prefix_engine_holds_one_sequence_and_the_cache():
    import argparse

    from sparkinfer.bench import engine

    args = argparse.Namespace(
        concurrency=(1, 32), prefill_lengths=(4096,), context=4096, new_tokens=128,
        max_batched_tokens=8192, enforce_eager=False, overlap_steps=True, dependent_launch=True,
        deterministic=False, prefix_reuse=32022, prefix_cache_snapshots=0, prefill_graph_tokens=512,
    )  # fmt: skip
    config = engine._prefix_scheduler_config(args)
    assert (config.max_num_seqs, config.max_model_len) == (1, 32022 + engine.PREFIX_SUFFIX + 1)
    assert config.prefix_cache_snapshots == engine.PREFIX_SNAPSHOTS
    assert engine._scheduler_config(args).prefix_cache_snapshots == 0  # the other rows: off
