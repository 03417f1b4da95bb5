"""The offline mode's join-under-load row on the CPU: the scheduler tests' tiny model in a real
engine, three streams decoding when a fourth prompt arrives."""

import math
import sys
from pathlib import Path

import pytest
from sparkinfer.bench import join_load
from sparkinfer.bench.join_load import JoinRow
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine


def test_a_prompt_joins_running_streams():
    sys.path.insert(0, str(Path(__file__).parents[2] / "scheduler" / "tests"))
    from scheduler_testing import build_tiny_model

    config = SchedulerConfig(block_size=16, max_model_len=128, max_num_seqs=4)
    engine = Engine.from_model(build_tiny_model(), config)
    try:
        row = join_load.measure_join(
            engine, streams=3, context=20, prompt_len=30, new_tokens=24, vocab=250, seed=0
        )
        assert engine.stats().num_used_kv_blocks == 0  # every request ended
    finally:
        engine.shutdown()
    assert (row.streams, row.context, row.prompt_len) == (3, 20, 30)
    assert row.ttft_ms > 0 and row.itl_median_ms > 0
    assert math.isnan(row.itl_join_max_ms) or row.itl_join_max_ms > 0


def test_too_few_tokens_to_decode_past_the_join_is_refused():
    with pytest.raises(ValueError, match="new_tokens is 10"):
        join_load.measure_join(
            None, streams=1, context=8, prompt_len=8, new_tokens=10, vocab=250, seed=0
        )


def test_table_columns():
    table = join_load.table([JoinRow(31, 4096, 256, 30.0, 20.0, 45.0)])
    assert table.rows == [[31, 4096, 256, 30.0, 20.0, 45.0]]
    assert len(table.columns) == 6
