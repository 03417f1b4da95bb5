"""One rank of the tensor-parallel model test, run as its own process (gloo on CPU).

argv: rank, world size, rendezvous port, then checkpoint folders. For each, runs a prompt chunk,
a second chunk and decode steps through the rank's sharded model (`run_rank`; the test runs
rank 0 in its own process and keeps its logits).
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.parallel.group import TensorParallelGroup
from sparkinfer.model.parallel.sharded_model import load_sharded_model

PROMPT = [3, 17, 250, 4000, 8100, 12, 99, 5, 6, 7, 4095, 4096, 4097]
DECODE = [11, 8000, 4096]
BLOCK_SIZE = 4


def run_steps(model) -> list[torch.Tensor]:
    """The steps both the sharded and the whole model run: [13, 3 decode] tokens, 2 sequences."""
    caches = allocate_caches(
        model.cache_spec(), num_blocks=16, block_size=BLOCK_SIZE, num_slots=2, device="cpu"
    )
    tables = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    out = []

    def step(new: list[list[int]], cached: list[int]) -> None:
        batch = ForwardBatch.build(
            [len(n) for n in new], cached, tables, [0, 1],
            caches=caches, block_size=BLOCK_SIZE, device="cpu",
        )  # fmt: skip
        ids = torch.tensor([t for n in new for t in n], dtype=torch.int64)
        out.append(model.compute_logits(model(ids, batch, logits_rows_only=True)))

    step([PROMPT[:8], PROMPT[:5]], [0, 0])
    step([PROMPT[8:], PROMPT[5:]], [8, 5])
    for i, token in enumerate(DECODE):
        step([[token], [token]], [len(PROMPT) + i] * 2)
    return out


def run_rank(rank: int, world: int, port: int, ckpts: list[str]) -> list[list[torch.Tensor]]:
    """Each checkpoint's step logits, from this rank's shard of it."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        tp = TensorParallelGroup(rank, world)
        return [
            run_steps(load_sharded_model(c, tp, device="cpu", dtype=torch.float32)) for c in ckpts
        ]
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_rank(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
