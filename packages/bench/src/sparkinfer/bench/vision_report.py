"""The `vision` benchmark's rows, header, tables, plots and gate."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from sparkinfer.bench.report import Gate, Plot, Table
from sparkinfer.bench.roofline import Peaks
from sparkinfer.bench.timing import Timing
from sparkinfer.model.config import VisionConfig


@dataclass(frozen=True)
class PeerResult:
    """transformers' tower on one case: its timing and its largest difference from ours."""

    timing: Timing | None
    max_abs_diff: float | None
    error: str


@dataclass(frozen=True)
class VisionRow:
    case: str
    kind: str
    media_bytes: int  # encoded PNG or MP4 file
    grid_thw: tuple[int, int, int]
    expected_grid: tuple[int, int, int]
    num_patches: int  # rows into the tower
    num_tokens: int  # pad tokens in the prompt
    num_output_rows: int  # rows out of the tower (must equal num_tokens)
    prep: Timing  # CPU wall time, data: URL to patches
    tower: Timing
    peer: PeerResult | None
    gflop: float
    roofline_ms: float  # FLOPs at the measured bf16 matmul rate
    loop: PeerResult | None = None  # our tower with the per-segment attention loop (the reference)

    @property
    def tower_tok_s(self) -> float:
        return self.num_tokens / (self.tower.median_ms / 1e3)

    @property
    def total_tok_s(self) -> float:
        """Tokens per second of preprocessing then the tower, one item at a time."""
        return self.num_tokens / ((self.prep.median_ms + self.tower.median_ms) / 1e3)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "tower_tok_s": self.tower_tok_s, "total_tok_s": self.total_tok_s}


def describe_tower(config: VisionConfig) -> str:
    c = config
    return (
        f"depth {c.depth}, hidden {c.hidden_size}, {c.num_heads} heads, intermediate "
        f"{c.intermediate_size}, patch {c.patch_size}, temporal {c.temporal_patch_size}, merge "
        f"{c.spatial_merge_size}, {c.num_position_embeddings} position embeddings, out_hidden "
        f"{c.out_hidden_size}"
    )


def context(
    name: str, config: VisionConfig, device: str, num_params: int, *, warmup: int, iters: int
) -> dict[str, object]:
    """The header lines below the provenance: shapes, device and dtype, how time was taken."""
    return {
        "tower": f"{name}: {describe_tower(config)}; random weights, {num_params:,} params",
        "tower device": f"{device}, "
        + ("CUDA-event timing" if device.startswith("cuda") else "wall-clock timing"),
        "preprocessing": "CPU wall time of process_image / process_video on data: URLs (base64, "
        f"decode, sampling at 2 fps, resize, normalise, patchify); torch threads "
        f"{torch.get_num_threads()}",
        "media": "PNG images (gradient + noise), H.264 MP4 clip (yuv420p), made in the run",
        "warmup/iters": f"{warmup}/{iters}, median and p90",
    }


def _ms(t: Timing | None, field: str) -> float | None:
    return None if t is None else getattr(t, field)


def tables(rows: list[VisionRow], peaks: Peaks, *, matmul_n: int, peer_note: str) -> list[Table]:
    latency = Table(
        "vision: preprocessing (CPU) and tower latency per item",
        [
            "case",
            "grid (t,h,w)",
            "patches",
            "tokens",
            "prep p50 ms",
            "prep p90 ms",
            "tower p50 ms",
            "tower p90 ms",
            "tower tok/s",
            "prep+tower tok/s",
        ],
        [
            [
                r.case,
                "x".join(map(str, r.grid_thw)),
                r.num_patches,
                r.num_tokens,
                r.prep.median_ms,
                r.prep.p90_ms,
                r.tower.median_ms,
                r.tower.p90_ms,
                r.tower_tok_s,
                r.total_tok_s,
            ]
            for r in rows
        ],
        ["tower time starts with the patches on the device (the host-to-device copy is not in it)"],
    )
    versus = Table(
        "vision tower vs roofline and transformers",
        [
            "case",
            "patches",
            "GFLOP",
            "roofline ms",
            "tower ms",
            "of roofline",
            "transformers ms",
            "transformers p90 ms",
            "speedup vs transformers",
            "max |diff| vs transformers",
        ],
        [_versus_row(r) for r in rows],
        [
            f"roofline: FLOPs (matmuls + attention) / bf16 matmul rate "
            f"{peaks.matmul_flop_s / 1e12:.4g} TFLOP/s measured in this run ({matmul_n}^3)",
            peer_note,
        ],
    )
    packed = Table(
        "vision tower: one attention launch per block vs the per-segment loop",
        ["case", "segments", "one launch ms", "per-segment loop ms", "speedup", "max |diff|"],
        [_packed_row(r) for r in rows],
        [
            "one launch: per block, one SDPA call batched over equal frame groups, or one varlen "
            "launch over groups of several lengths (CUDA bf16), as served (on a GPU under the "
            "engine's CUDA graphs per grid); loop: one SDPA call per frame group, launched "
            "eagerly, the reference path"
        ],
    )
    return [latency, versus, packed]


def _packed_row(r: VisionRow) -> list[object]:
    loop = r.loop.timing if r.loop is not None else None
    loop_ms = _ms(loop, "median_ms")
    diff: object = None
    if r.loop is not None:
        diff = r.loop.error or r.loop.max_abs_diff
    return [
        r.case,
        r.grid_thw[0],
        r.tower.median_ms,
        loop_ms,
        None if loop_ms is None else loop_ms / r.tower.median_ms,
        diff,
    ]


def _versus_row(r: VisionRow) -> list[object]:
    peer = r.peer.timing if r.peer is not None else None
    hf_ms = _ms(peer, "median_ms")
    diff: object = None
    if r.peer is not None:
        diff = r.peer.error or r.peer.max_abs_diff
    return [
        r.case,
        r.num_patches,
        r.gflop,
        r.roofline_ms,
        r.tower.median_ms,
        r.roofline_ms / r.tower.median_ms,
        hf_ms,
        _ms(peer, "p90_ms"),
        None if hf_ms is None else hf_ms / r.tower.median_ms,
        diff,
    ]


def plots(rows: list[VisionRow]) -> list[Plot]:
    names = [r.case for r in rows]
    latency: dict[str, list[float | None]] = {
        "preprocessing (CPU)": [r.prep.median_ms for r in rows],
        "tower": [r.tower.median_ms for r in rows],
    }
    if any(r.peer is not None and r.peer.timing is not None for r in rows):
        latency["transformers tower"] = [
            _ms(r.peer.timing if r.peer else None, "median_ms") for r in rows
        ]
    latency["tower roofline"] = [r.roofline_ms for r in rows]
    return [
        Plot(
            "vision-latency.png",
            "Vision latency per item",
            "case",
            "ms",
            names,
            latency,
            is_log_y=True,
            kind="bar",
        ),
        Plot(
            "vision-throughput.png",
            "Vision tokens per second, one item at a time",
            "case",
            "tok/s",
            names,
            {
                "tower": [r.tower_tok_s for r in rows],
                "preprocessing + tower": [r.total_tok_s for r in rows],
            },
            kind="bar",
        ),
    ]


def grid_gate(rows: list[VisionRow]) -> Gate:
    """Each case's grid matches docs/model.md §9 and the tower returns one row per pad token."""
    bad = [
        f"{r.case}: grid {r.grid_thw}, expected {r.expected_grid}; tower rows "
        f"{r.num_output_rows} for {r.num_tokens} tokens"
        for r in rows
        if r.grid_thw != r.expected_grid or r.num_output_rows != r.num_tokens
    ]
    return Gate("grids and token counts as expected", not bad, "; ".join(bad) or "all cases")
