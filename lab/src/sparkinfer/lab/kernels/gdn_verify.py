"""Speculative verify of one Gated-DeltaNet layer at 27B shapes: the per-position decode kernels
with a state copy per position (the roll-back rows) against the verify kernels and the commit.

Both run k = 3 drafts (4 positions) for every sequence, one accepted. "per-position": for each
position the conv update and the recurrent decode kernel (state read and written in place), then
the conv and recurrent state of each sequence copied to a roll-back row, and the kept one copied
back. "verify + commit": the gates' stash copy, `causal_conv1d_verify` (which stashes its inputs
and outputs itself) and `fused_recurrent_gated_delta_rule_verify` (state only read), then
`causal_conv1d_commit` and `fused_recurrent_gated_delta_rule_commit` over the kept positions.
Each is timed as CUDA-graph replays (`time_graph`), per layer and over the 48 layers. Run alone:
``python -m sparkinfer.lab.kernels.gdn_verify [--quick]``.
"""

from __future__ import annotations

from typing import Any

import torch
from sparkinfer.kernels.causal_conv1d import (
    causal_conv1d_commit,
    causal_conv1d_update,
    causal_conv1d_verify,
)
from sparkinfer.kernels.gated_delta_rule import (
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_commit,
    fused_recurrent_gated_delta_rule_verify,
)
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import time_graph

NUM_HEADS, NUM_V_HEADS, HEAD_DIM = 16, 48, 128
CONV_DIM, CONV_WIDTH = 2 * NUM_HEADS * HEAD_DIM + NUM_V_HEADS * HEAD_DIM, 4
NUM_GDN_LAYERS = 48
NUM_POSITIONS, NUM_KEPT = 4, 2  # k = 3 drafts, one accepted
BATCHES = (1, 8, 12, 32)

Row = dict[str, Any]


class Layer:
    """One layer's inputs for B sequences at NUM_POSITIONS positions, position-major rows."""

    def __init__(self, num_seqs: int, device: str) -> None:
        gen = torch.Generator(device=device).manual_seed(0)
        n = num_seqs * NUM_POSITIONS

        def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return torch.randn(*shape, device=device, generator=gen, dtype=dtype)

        self.num_seqs = num_seqs
        self.qkv = randn(n, CONV_DIM)
        self.gates = randn(n, 2 * NUM_V_HEADS)  # [b | a], the in_proj's columns
        self.b, self.a = self.gates.split(NUM_V_HEADS, dim=1)
        self.weight = randn(CONV_DIM, CONV_WIDTH)
        self.A_log = torch.rand(NUM_V_HEADS, device=device, generator=gen) * 2.0
        self.dt_bias = randn(NUM_V_HEADS, dtype=torch.float32)
        num_slots = num_seqs * (NUM_POSITIONS + 1)  # the slots, then the roll-back rows
        self.conv = randn(num_slots, CONV_WIDTH - 1, CONV_DIM)
        shape = (num_slots, NUM_V_HEADS, HEAD_DIM, HEAD_DIM)
        self.state = randn(*shape, dtype=torch.float32) * 0.1
        self.slots = torch.arange(num_seqs, device=device)
        positions = torch.arange(NUM_POSITIONS, device=device)
        self.rows = (positions[None, :] * num_seqs + self.slots[:, None]).contiguous()
        self.kept = torch.full((num_seqs,), NUM_KEPT, device=device)
        self.stash = [torch.empty_like(t) for t in (self.qkv, self.qkv, self.gates)]

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = x.split((NUM_HEADS * HEAD_DIM, NUM_HEADS * HEAD_DIM, NUM_V_HEADS * HEAD_DIM), 1)
        n = x.shape[0]
        return (
            q.reshape(n, NUM_HEADS, HEAD_DIM),
            k.reshape(n, NUM_HEADS, HEAD_DIM),
            v.reshape(n, NUM_V_HEADS, HEAD_DIM),
        )

    def per_position(self) -> None:
        b = self.num_seqs
        for j in range(NUM_POSITIONS):
            rows = slice(j * b, (j + 1) * b)
            x = causal_conv1d_update(self.qkv[rows], self.weight, self.conv, state_slots=self.slots)
            q, k, v = self.split(x)
            fused_recurrent_gated_delta_rule(
                q, k, v, self.a[rows], self.b[rows], self.A_log, self.dt_bias, self.state,
                state_slots=self.slots, early_state=j == 0,
            )  # fmt: skip
            if j < NUM_POSITIONS - 1:
                snapshot = self.slots + b * (j + 1)
                self.conv.index_copy_(0, snapshot, self.conv.index_select(0, self.slots))
                self.state.index_copy_(0, snapshot, self.state.index_select(0, self.slots))
        kept = self.slots + b * NUM_KEPT  # the kept position's roll-back rows, copied back
        self.conv.index_copy_(0, self.slots, self.conv.index_select(0, kept))
        self.state.index_copy_(0, self.slots, self.state.index_select(0, kept))

    def verify_and_commit(self) -> None:
        conv_in, conv_out, gates = self.stash
        gates.copy_(self.gates)
        b, a = gates.split(NUM_V_HEADS, dim=1)
        slots, rows = self.slots, self.rows
        x = causal_conv1d_verify(
            self.qkv, self.weight, self.conv, state_slots=slots, verify_rows=rows,
            out=conv_out, x_out=conv_in,
        )  # fmt: skip
        q, k, v = self.split(x)
        fused_recurrent_gated_delta_rule_verify(
            q, k, v, a, b, self.A_log, self.dt_bias, self.state, state_slots=slots, verify_rows=rows
        )
        causal_conv1d_commit(
            conv_in, self.conv, state_slots=slots, verify_rows=rows, num_kept=self.kept
        )
        _, k, v = self.split(conv_out)
        fused_recurrent_gated_delta_rule_commit(
            k, v, a, b, self.A_log, self.dt_bias, self.state,
            state_slots=slots, verify_rows=rows, num_kept=self.kept,
        )  # fmt: skip


def measure(*, warmup: int, iters: int, quick: bool, device: str) -> list[Row]:
    rows: list[Row] = []
    for num_seqs in BATCHES[:2] if quick else BATCHES:
        layer = Layer(num_seqs, device)
        impls = (("per-position", layer.per_position), ("verify+commit", layer.verify_and_commit))
        for impl, fn in impls:
            t = time_graph([fn], warmup=warmup, iters=iters)
            rows.append({
                "op": "gdn_verify", "impl": impl,
                "shape": f"B={num_seqs} T={NUM_POSITIONS} kept={NUM_KEPT}",
                "median_ms": t.median_ms, "p90_ms": t.p90_ms,
                "x48_layers_ms": t.median_ms * NUM_GDN_LAYERS,
            })  # fmt: skip
        del layer
        torch.cuda.empty_cache()
    return rows


def run(args: Any) -> list[Row]:
    """The `sparkinfer-lab kernels` entry point (args: KernelBenchArgs)."""
    return measure(
        warmup=args.warmup, iters=args.iters, quick=args.is_quick, device=str(args.device)
    )


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=5, iters=30).parse_args(), __doc__)


if __name__ == "__main__":
    main()
