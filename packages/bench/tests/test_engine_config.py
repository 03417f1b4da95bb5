"""offline_config: the one builder of bench's and lab's engine configs."""

import argparse
import dataclasses

from sparkinfer.bench.engine_config import ENGINE_FLAGS, offline_config
from sparkinfer.scheduler.config import SchedulerConfig


def test_declared_flags_set_their_fields_and_the_rest_keep_the_defaults() -> None:
    args = argparse.Namespace(max_batched_tokens=4096, deterministic=True, context=99)
    config = offline_config(args, max_num_seqs=8, max_model_len=1024)
    expected = SchedulerConfig(
        max_num_seqs=8, max_model_len=1024, max_num_batched_tokens=4096, deterministic=True
    )
    assert config == expected


def test_without_flags_it_is_the_servers_defaults_with_the_runs_room() -> None:
    config = offline_config(None, max_num_seqs=2, max_model_len=512)
    assert config == SchedulerConfig(max_num_seqs=2, max_model_len=512)


def test_every_flag_names_a_config_field() -> None:
    fields = {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert set(ENGINE_FLAGS.values()) <= fields
