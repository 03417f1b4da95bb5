from types import SimpleNamespace
from typing import cast

import pytest
import torch
from sparkinfer.bench.errors import DeviceError
from sparkinfer.bench.tracker import OutputTracker
from sparkinfer.lab import idle_gaps, profile


def test_kernel_names_fall_into_their_ops():
    assert profile.category("_skinny_gemm_kernel") == "linear (Triton skinny GEMM)"
    assert profile.category("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "linear (cuBLAS)"
    assert profile.category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "linear (cuBLAS)"
    assert profile.category("_chunk_state_kernel") == "GDN chunk prefill"
    assert profile.category("_fused_recurrent_kernel") == "GDN recurrent decode"
    assert profile.category("_decode_merge_kernel") == "attention decode"
    assert profile.category("_prefill_kernel") == "attention prefill"
    assert profile.category("_prefill_tma_kernel") == "attention prefill"
    assert profile.category("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == (
        "attention prefill"
    )
    assert profile.category("_chunk_solve_kernel") == "GDN chunk prefill"
    assert profile.category("_gated_rms_norm_kernel") == "RMSNorm (plain, gated)"
    assert profile.category("void at::native::vectorized_elementwise_kernel<4>") == (
        "torch copies, fills, elementwise"
    )
    assert profile.category("void cublasLt::splitKreduce_kernel<32, 16>") == "linear (cuBLAS)"
    assert profile.category("_qk_norm_rotary_kernel") == "q/k norm + rotary + KV write"
    assert profile.category("something_new") == "other"


def test_windows_sum_kernels_per_step_and_group_them():
    kernels = profile.summarise(
        [("_skinny_gemm_kernel", 10.0), ("_rms_norm_kernel", 2.0), ("_skinny_gemm_kernel", 12.0)]
    )
    assert kernels[0] == profile.KernelTotal("_skinny_gemm_kernel", 2, 22.0)
    w = profile.Window("decode 1 x 4096", steps=2, wall_ms=0.05, kernels=kernels)
    assert w.gpu_ms_per_step == 0.012 and w.kernels_per_step == 1.5
    tables = profile.tables([w], top=5)
    assert [t.title for t in tables][1:] == [
        "decode 1 x 4096: GPU time per step by op",
        "decode 1 x 4096: the 5 largest kernels",
    ]
    summary = tables[0].rows[0]
    assert summary[:2] == ["decode 1 x 4096", 2] and summary[3] is None
    assert abs(summary[5] - 0.48) < 1e-9
    by_op = tables[1].rows
    assert by_op[0][0] == "linear (Triton skinny GEMM)" and by_op[0][2] == 11.0
    assert abs(sum(r[3] for r in by_op) - 1.0) < 1e-9


class _Event:
    def __init__(self, **kw):
        self.streams = []

    def record(self, stream):
        self.streams.append(stream)


def test_the_replay_timer_times_decode_replays_only_inside_its_block(monkeypatch):
    monkeypatch.setattr(profile.torch.cuda, "Event", _Event)
    timer, stream = profile.ReplayTimer(), cast(torch.cuda.Stream, object())
    with timer.span("decode_replay", stream):  # before the block: nothing recorded
        pass
    with timer.recording() as events:
        with timer.span("decode_replay", stream):
            assert len(events) == 0  # appended once the replay's end is recorded
        with timer.span("draft_propose", stream), timer.span("decode_replay", None):
            pass  # neither a replay nor on a CUDA stream
        assert len(events) == 1
        assert all(cast(_Event, e).streams == [stream] for e in events[0])
    with timer.span("decode_replay", stream):
        pass
    assert len(events) == 1


def test_waits_stop_at_the_first_failed_request():
    tracker = OutputTracker(num_left=1)
    tracker.callback("p-0")(SimpleNamespace(new_token_ids=[], is_finished=True, error="boom"))
    with pytest.raises(DeviceError, match=r"requests failed.*p-0: boom"):
        profile._wait(lambda: False, 600, "2 streams decoding", tracker)


def test_prefill_windows_list_their_idle_gaps():
    gaps = idle_gaps.Idle(0.042, 0.024, (idle_gaps.Gap(18.0, "c", "d"),))
    w = profile.Window("prefill 4096", 1, 0.05, profile.summarise([("a", 4.0)]), idle=gaps)
    tables = profile.tables([w], top=5)
    assert tables[-1].title == "prefill 4096: the longest idle gaps"
    assert tables[-1].rows == [[18.0, "c", "d"]]
    assert tables[0].rows[0][-2:] == [0.042, 0.024]


def test_the_profile_engine_is_configured_from_the_cli_defaults():
    from sparkinfer.lab.__main__ import build_parser

    args = build_parser().parse_args(["profile", "--decode-batches", "1,32"])
    config = profile.scheduler_config(args)
    assert config.max_num_seqs == 32 and config.max_num_batched_tokens == 8192
    assert config.max_model_len >= 4096 + 1 and config.dependent_launch
