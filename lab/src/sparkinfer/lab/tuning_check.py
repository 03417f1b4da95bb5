"""A GPU check of the kernels' `KernelTuning` as the engine passes it: dependent launch follows the
tuning, a named shape table reaches the dispatcher, the engine's CUDA graphs capture either mode
with the same greedy tokens, and a block size the CUDA kernels cannot tile stops the runner.

``PYTHONPATH=packages/kernels/src:packages/model/src:packages/multimodal/src:packages/scheduler/src:lab/src
python3 -m sparkinfer.lab.tuning_check``: one row per check, each in its own try/except.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

PROMPT = list(range(1000, 1064))
NEW_TOKENS = 24


def _dependent_launch() -> str:
    from sparkinfer.kernels.dependent_launch import dependent_launch
    from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning

    x = torch.zeros(1, device="cuda")
    with kernel_tuning(KernelTuning(use_dependent_launch=False)):
        off = dependent_launch(x)
    hopper = torch.cuda.get_device_capability()[0] >= 9
    ok = dependent_launch(x) == hopper and not off
    return f"{'ok' if ok else 'FAIL'}: default {dependent_launch(x)} (sm90+: {hopper}), off {off}"


def _named_table() -> str:
    from sparkinfer.kernels.linear import linear
    from sparkinfer.kernels.linear.shape_table import ShapeTable, lookup
    from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning

    x = torch.randn(8, 5120, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(16384, 5120, device="cuda", dtype=torch.bfloat16) * 0.02
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "empty.json"
        path.write_text(json.dumps({"entries": []}))
        empty = ShapeTable.load(path)
    committed_tile = lookup(8, 16384, 5120, torch.bfloat16)
    y = linear(x, w)
    with kernel_tuning(KernelTuning(shape_table=empty)):
        tile = lookup(8, 16384, 5120, torch.bfloat16)
        y_empty = linear(x, w)  # cuBLAS
    diff = (y.float() - y_empty.float()).abs().max().item()
    ok = tile is None and diff < 0.02 * y.float().abs().max().item()
    verdict = "ok" if ok else "FAIL"
    return f"{verdict}: committed {committed_tile}, empty table {tile}, max diff {diff:.3g}"


def _engine_tokens(dependent_launch: bool) -> tuple[list[int], float]:
    from sparkinfer.model import embedded
    from sparkinfer.scheduler.config import SchedulerConfig
    from sparkinfer.scheduler.engine import Engine
    from sparkinfer.scheduler.request import SamplingParams

    model = embedded.build_random_model(device="cuda", dtype=torch.bfloat16)
    cfg = SchedulerConfig(
        max_num_seqs=4, max_model_len=512, dependent_launch=dependent_launch, num_kv_blocks=64
    )
    engine = Engine.from_model(model, cfg, device="cuda")
    try:
        start = time.perf_counter()
        tokens = engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
        return tokens, time.perf_counter() - start
    finally:
        engine.shutdown()


def _engine_modes() -> str:
    on, on_s = _engine_tokens(True)
    off, off_s = _engine_tokens(False)
    verdict = "ok" if on == off and len(on) == NEW_TOKENS else "FAIL"
    return f"{verdict}: same greedy tokens {on == off} ({on_s:.2f} s on, {off_s:.2f} s off)"


def _small_block() -> str:
    from sparkinfer.model import embedded
    from sparkinfer.scheduler.config import SchedulerConfig
    from sparkinfer.scheduler.errors import InvalidConfig
    from sparkinfer.scheduler.runner import Runner

    model = embedded.build_random_model(device="cuda", dtype=torch.bfloat16)
    try:
        Runner(model, SchedulerConfig(block_size=8, max_model_len=512), device="cuda")
    except InvalidConfig as exc:
        return f"ok: {exc}"
    return "FAIL: block_size 8 started on CUDA"


CHECKS: dict[str, Callable[[], str]] = {
    "dependent launch follows the tuning": _dependent_launch,
    "a named shape table reaches the dispatcher": _named_table,
    "engine, dependent launch on vs off": _engine_modes,
    "block_size 8 on CUDA": _small_block,
}


def main() -> None:
    print(f"| check | result |  ({torch.cuda.get_device_name()})")
    print("|---|---|")
    for name, check in CHECKS.items():
        try:
            result = check()
        except Exception as exc:  # each row reports its own failure
            result = f"ERROR {type(exc).__name__}: {exc} @ {traceback.format_exc(limit=-1).strip()}"
        print(f"| {name} | {result} |", flush=True)


if __name__ == "__main__":
    main()
