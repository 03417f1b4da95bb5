import dataclasses

import pytest
from sparkinfer.kernels.gated_delta_rule import chunk
from sparkinfer.scheduler.config import HELP, PREFILL_CHUNK_ALIGNMENT, SchedulerConfig
from sparkinfer.scheduler.errors import InvalidConfig


def test_defaults():
    cfg = SchedulerConfig()
    assert cfg.block_size == 64 and cfg.gpu_memory_utilization == 0.90
    assert not cfg.deterministic and not cfg.enforce_eager and cfg.max_queue_depth == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_num_seqs", 0, "max_num_seqs is 0; it must be >= 1"),
        ("max_queue_depth", -1, "max_queue_depth is -1"),
        ("gpu_memory_utilization", 1.5, "gpu_memory_utilization is 1.5"),
        ("num_kv_blocks", 0, "num_kv_blocks is 0"),
        ("prefill_graph_tokens", -1, "prefill_graph_tokens is -1"),
        ("block_size", 48, r"block_size is 48; it must be a power of two \(16, 32, 64"),
        ("block_size", 0, "block_size is 0"),
        ("num_speculative_tokens", 17, "num_speculative_tokens is 17; it must be 1 to 16"),
        ("speculative", "eagle", "speculative is 'eagle'; it must be one of auto, off, ngram, mtp"),
        ("prefix_cache_min_tokens", 0, "prefix_cache_min_tokens is 0"),
    ],
)
def test_invalid_values_raise_naming_the_field(field, value, message):
    with pytest.raises(InvalidConfig, match=message) as info:
        SchedulerConfig(**{field: value})
    assert info.value.setting == field and isinstance(info.value, ValueError)


def test_cuda_needs_blocks_of_at_least_16_tokens():
    SchedulerConfig(block_size=4)  # the CPU references (and the scheduler's tests) take any
    SchedulerConfig(block_size=16).check_cuda()
    with pytest.raises(InvalidConfig, match="block_size is 8; it must be a power of two >= 16"):
        SchedulerConfig(block_size=8).check_cuda()


def test_kernel_tuning_comes_from_the_config():
    from sparkinfer.kernels.tuning import KernelTuning

    assert SchedulerConfig().kernel_tuning == KernelTuning()
    off = SchedulerConfig(dependent_launch=False).kernel_tuning
    assert off == KernelTuning(use_dependent_launch=False) and off.shape_table is None


def test_every_field_has_a_description():
    for f in dataclasses.fields(SchedulerConfig):
        assert f.metadata[HELP] and "%" not in f.metadata[HELP], f.name


def test_speculative_auto_is_the_default_and_becomes_the_mtp_head_or_plain_decoding():
    cfg = SchedulerConfig()
    assert cfg.speculative == "auto" and not cfg.is_speculative  # not until made concrete
    assert cfg.resolve_speculative(has_mtp_head=True).speculative == "mtp"
    assert cfg.resolve_speculative(has_mtp_head=False).speculative == "off"
    ngram = SchedulerConfig(speculative="ngram")
    assert ngram.resolve_speculative(has_mtp_head=True) is ngram  # a choice stays as it is
    assert ngram.resolve_speculative(has_mtp_head=True, draft_model_depth=7) is ngram


def test_speculative_auto_drafts_with_a_given_block_drafter_as_deep_as_its_block():
    auto = SchedulerConfig().resolve_speculative(has_mtp_head=True, draft_model_depth=15)
    assert auto.speculative == "draft_model" and auto.num_speculative_tokens == 15
    # The verify stash: every sequence with its 15 drafts, within the step's token budget.
    assert auto.is_speculative and auto.num_verify_rows == min(64 * 16, 2048)
    chosen = SchedulerConfig(speculative="draft_model")
    assert chosen.resolve_speculative(has_mtp_head=False, draft_model_depth=7).speculative == (
        "draft_model"
    )


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SchedulerConfig().max_num_seqs = 3  # type: ignore[misc]


def test_graph_batch_sizes_follow_buckets():
    cfg = SchedulerConfig()
    assert cfg.graph_batch_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 48, 64)
    assert cfg.graph_batch_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert cfg.graph_batch_sizes(200)[-4:] == (128, 160, 192, 200)


def test_prefill_graph_sizes_double_then_step_up_to_the_setting_or_the_step_budget():
    sizes = (16, 32, 64, 128, 192, 256, 320, 384, 448, 512)
    assert SchedulerConfig().prefill_graph_sizes() == sizes
    assert SchedulerConfig(max_num_batched_tokens=100).prefill_graph_sizes() == (16, 32, 64, 100)
    assert SchedulerConfig(prefill_graph_tokens=300).prefill_graph_sizes() == (*sizes[:6], 300)
    assert SchedulerConfig(prefill_graph_tokens=16).prefill_graph_sizes() == (16,)
    assert SchedulerConfig(prefill_graph_tokens=5).prefill_graph_sizes() == (5,)
    assert SchedulerConfig(prefill_graph_tokens=0).prefill_graph_sizes() == ()


def test_chunk_alignment_is_a_whole_gdn_output_block():
    # Deterministic prompt cuts keep numerics only on the GDN prefill's output-block boundaries.
    assert PREFILL_CHUNK_ALIGNMENT % (chunk.BT * chunk.LAUNCH.out_chunks) == 0


def test_max_seqs_per_step_is_max_num_seqs_bounded_by_the_state_slots():
    assert SchedulerConfig(max_num_seqs=8).max_seqs_per_step == 8  # slots not known yet
    assert SchedulerConfig(max_num_seqs=8, num_state_slots=3).max_seqs_per_step == 3
    assert SchedulerConfig(max_num_seqs=2, num_state_slots=5).max_seqs_per_step == 2
    cfg = SchedulerConfig(max_num_seqs=8)
    assert cfg.resolve_state_slots(6).max_seqs_per_step == 6
    assert cfg.resolve_state_slots(6).num_state_slots == 6 and cfg.num_state_slots is None
    resolved = cfg.resolve_state_slots(6)
    assert resolved.resolve_state_slots(6) is resolved
