import pytest
import torch
from sparkinfer.bench import engine, roofline
from sparkinfer.bench.__main__ import main
from sparkinfer.model.decoder import Qwen3_8ForCausalLM


def test_full_size_config_matches_the_27b_parameter_count():
    text = engine.full_size_config().text
    assert len(text.full_attention_layers) == 16 and text.full_attention_layers[0] == 3
    # docs/model.md §2: 25,624,600,064 text params without the embedding table, minus norms and conv
    assert abs(roofline.matmul_params(text) - 25_624_600_064) / 25_624_600_064 < 0.002
    assert roofline.kv_bytes_per_token(text) == 64 * 1024
    assert abs(roofline.state_bytes_per_seq(text) - 153_944_064) < 1024


def test_roofline_matches_the_quoted_single_stream_figure():
    text = engine.full_size_config().text
    # 82.7 tok/s at 4K context is what a ~4.29 TB/s copy rate gives for ~51.8 GB per step
    peaks = roofline.Peaks(copy_bytes_s=4.286e12, matmul_flop_s=800e12)
    assert roofline.decode_roofline_tok_s(text, peaks, batch=1, context=4096) == pytest.approx(
        82.7, rel=0.01
    )
    many = roofline.decode_roofline_tok_s(text, peaks, batch=32, context=4096)
    assert 20 * 82.7 < many < 32 * 82.7  # weights amortised, per-sequence bytes are not
    short = roofline.prefill_roofline_tok_s(text, peaks, prompt_len=4096)
    long = roofline.prefill_roofline_tok_s(text, peaks, prompt_len=262_144)
    assert 14_000 < short < 16_500 and long < short / 1.8


def test_random_fill_gives_finite_logits_on_a_tiny_model():
    cfg = engine.full_size_config(num_layers=4)
    tiny = engine.ModelConfig(
        model_type="qwen3_5",
        architecture="Qwen3_5ForCausalLM",
        text=engine.TextConfig(
            **{
                **cfg.text.__dict__,
                "hidden_size": 64,
                "intermediate_size": 128,
                "vocab_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 32,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
            }
        ),
    )
    model = Qwen3_8ForCausalLM(tiny, device="cpu", dtype=torch.float32)
    engine.fill_random(model, seed=0)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    a_log = next(p for n, p in model.named_parameters() if n.endswith("A_log"))
    assert a_log.min() >= 0 and a_log.max() <= torch.log(torch.tensor(16.0))


def test_offline_without_cuda_says_so(tmp_path, capsys):
    if torch.cuda.is_available():
        return
    assert main(["offline", "--out", str(tmp_path)]) == 2
    assert "offline needs a CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
def test_offline_runs_a_short_stack_on_the_gpu(tmp_path):
    argv = [
        "offline",
        "--num-layers",
        "4",
        "--concurrency",
        "1,2",
        "--context",
        "256",
        "--new-tokens",
        "8",
        "--prefill-lengths",
        "512",
        "--iters",
        "1",
        "--skip-hf",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert (tmp_path / "offline-decode.png").exists()
