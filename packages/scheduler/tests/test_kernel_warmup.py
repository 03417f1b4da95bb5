"""Start-up builds every kernel variant: no request, of any size or mix, waits on a Triton build
(GPU; a build of the attention prefill kernel takes 1.5-2 s on an H200)."""

import threading

import pytest
import torch
from scheduler_testing import build_tiny_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.request import SamplingParams

# Qwen3.8-27B's attention heads, so the prefill kernel takes its 27B variants.
ATTENTION_27B = {
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 32768,
}
# Each step: the prompt lengths of requests sent together (chunked past the token budget).
STEPS = [
    [4096], [1000], [3000], [17], [1], [2048, 2048], [16000], [100, 100, 100], [4096] * 4,
    [600], [6000], [8192], [8000], [700] * 5, [33] * 7, [12000],
]  # fmt: skip


def _run_together(engine: Engine, lengths: list[int], tag: str) -> None:
    done, left = threading.Event(), [len(lengths)]
    lock = threading.Lock()

    def on_output(out) -> None:
        if out.is_finished:
            assert out.error is None, out.error
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for i, n in enumerate(lengths):
        prompt = [(31 * i + 7 * j) % 250 for j in range(n)]
        engine.add_request(f"{tag}-{i}", prompt, params, on_output=on_output)
    assert done.wait(600), f"{tag} did not finish"


@pytest.mark.gpu
def test_no_kernel_is_built_after_the_engine_starts():
    from triton import knobs

    model = build_tiny_model(device="cuda", dtype=torch.bfloat16, overrides=ATTENTION_27B)
    cfg = SchedulerConfig(
        block_size=64, max_model_len=20000, max_num_seqs=8, max_num_batched_tokens=8192
    )
    engine = Engine.from_model(model, cfg)
    builds: list[tuple[str, str]] = []
    step = ["none"]

    def on_build(**kwargs) -> bool:
        builds.append((step[0], kwargs["fn"].name))
        return False  # build it: only counted

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, on_build
    try:
        for i, lengths in enumerate(STEPS):
            step[0] = f"prompts of {lengths[0]} tokens x {len(lengths)}"
            _run_together(engine, lengths, f"step{i}")
    finally:
        knobs.runtime.jit_cache_hook = previous
        engine.shutdown()
    assert builds == []
