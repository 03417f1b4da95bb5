"""The `vision` mode: media preprocessing on the CPU and the vision tower on the device.

For each case (model.md §9's worked examples and a large image) the media made in the run go through
`sparkinfer.multimodal` as `data:` URLs, then their patches through `sparkinfer.model`'s
`VisionModel` at Qwen3.8-27B's vision shapes with random weights. transformers'
`Qwen3_5VisionModel` runs on the same weights and inputs where it imports, and the roofline is the
tower's FLOPs over the bf16 matmul rate measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import torch
from sparkinfer.bench import roofline, vision_media, vision_report
from sparkinfer.bench.errors import DeviceError
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report, log
from sparkinfer.bench.timing import Timing, time_on
from sparkinfer.bench.vision_report import PeerResult, VisionRow
from sparkinfer.model import vision as vision_model
from sparkinfer.model.config import VisionConfig
from sparkinfer.model.vision import VisionModel, segment_attention_ref
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.vision.graphs import TowerGraphs

# docs/model.md §1 vision_config of Qwen3.8-27B (patch 16, temporal 2, merge 2 are the defaults)
VISION_27B = VisionConfig(
    depth=27,
    hidden_size=1152,
    num_heads=16,
    intermediate_size=4304,
    out_hidden_size=5120,
    num_position_embeddings=2304,
)
# --tiny: real patch geometry, 2 blocks 32 wide, an 8x8 position grid
VISION_TINY = VisionConfig(
    depth=2,
    hidden_size=32,
    num_heads=2,
    intermediate_size=48,
    out_hidden_size=24,
    num_position_embeddings=64,
)


@dataclass(frozen=True)
class TowerSetup:
    config: VisionConfig
    device: torch.device
    dtype: torch.dtype
    warmup: int
    iters: int


def resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "vision needs a CUDA device for the tower and torch.cuda.is_available() is False: "
            "run on a GPU machine, or pass --device cpu --tiny for a smoke run"
        )
    return device


@torch.no_grad()
def fill_random(model: torch.nn.Module, seed: int) -> None:
    """N(0, 0.02) weights and biases; LayerNorm gains 1, so every block does real work."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name and name.endswith("weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02, generator=gen)


def build_tower(setup: TowerSetup, *, seed: int) -> VisionModel:
    tower = VisionModel(setup.config, device=setup.device, dtype=setup.dtype)
    fill_random(tower, seed)
    return tower.eval()


def time_tower(
    tower: Callable[..., torch.Tensor],
    pixels: torch.Tensor,
    grid: tuple[int, int, int],
    setup: TowerSetup,
) -> tuple[torch.Tensor, Timing]:
    """One forward for the output, then the timed ones (CUDA events on a GPU)."""
    out = tower(pixels, [grid])
    return out, time_on(
        setup.device, lambda: tower(pixels, [grid]), warmup=setup.warmup, iters=setup.iters
    )


def served_tower(tower: VisionModel, setup: TowerSetup) -> Callable[..., torch.Tensor]:
    """The tower as the server runs it: on a GPU under CUDA graphs per grid (the engine's
    default `vision_graph_patches`), eager elsewhere."""
    if setup.device.type != "cuda":
        return tower
    return TowerGraphs(tower, max_patches=SchedulerConfig().vision_graph_patches)


def build_hf_peer(tower: VisionModel, setup: TowerSetup) -> tuple[torch.nn.Module | None, str]:
    """transformers' Qwen3_5VisionModel with the tower's weights, or None and why not."""
    try:
        from transformers import Qwen3_5VisionConfig, Qwen3_5VisionModel
    except ImportError as e:
        return None, f"transformers peer skipped: Qwen3_5VisionModel does not import ({e})"
    c = setup.config
    hf_config = Qwen3_5VisionConfig(
        depth=c.depth,
        hidden_size=c.hidden_size,
        hidden_act=c.hidden_act,
        intermediate_size=c.intermediate_size,
        num_heads=c.num_heads,
        in_channels=c.in_channels,
        patch_size=c.patch_size,
        spatial_merge_size=c.spatial_merge_size,
        temporal_patch_size=c.temporal_patch_size,
        out_hidden_size=c.out_hidden_size,
        num_position_embeddings=c.num_position_embeddings,
    )
    try:
        with torch.device(setup.device):
            model = Qwen3_5VisionModel._from_config(hf_config, dtype=setup.dtype)
        model.load_state_dict(tower.state_dict(), strict=True)
    except torch.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        return None, "transformers peer skipped: it does not fit in the free device memory"
    impl = model.config._attn_implementation
    return model.eval(), f"transformers {impl} attention, same weights and inputs"


def time_peer(
    model: torch.nn.Module,
    pixels: torch.Tensor,
    grid: tuple[int, int, int],
    ours: torch.Tensor,
    *,
    setup: TowerSetup,
) -> PeerResult:
    grid_thw = torch.tensor([grid], device=setup.device)

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return model(pixels, grid_thw=grid_thw).pooler_output

    try:
        out = call()
        timing = time_on(setup.device, call, warmup=setup.warmup, iters=setup.iters)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return PeerResult(None, None, "out of memory")
    diff = (out.float() - ours.float()).abs().max().item()
    return PeerResult(timing, diff, "")


def time_loop(
    tower: VisionModel,
    pixels: torch.Tensor,
    grid: tuple[int, int, int],
    ours: torch.Tensor,
    *,
    setup: TowerSetup,
) -> PeerResult:
    """Our tower with its attention on the per-segment reference loop: the packed launch's
    speedup, and its largest difference from the reference."""
    try:
        with mock.patch.object(vision_model, "segment_attention", segment_attention_ref):
            out, timing = time_tower(tower, pixels, grid, setup)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return PeerResult(None, None, "out of memory")
    except Exception as e:  # the row reports it; the other rows go on
        return PeerResult(None, None, f"{type(e).__name__}: {e}")
    return PeerResult(timing, (out.float() - ours.float()).abs().max().item(), "")


def measure_case(
    case: vision_media.Case,
    tower: VisionModel,
    peer: torch.nn.Module | None,
    peaks: roofline.Peaks,
    *,
    setup: TowerSetup,
    seed: int,
) -> VisionRow:
    log(f"vision: {case.name}: making the media")
    url, num_bytes = vision_media.media_url(case, seed=seed)
    log(f"vision: {case.name}: preprocessing x {setup.iters}")
    media, prep = vision_media.preprocess(case, url, warmup=setup.warmup, iters=setup.iters)
    pixels = media.pixel_values.to(setup.device)
    log(f"vision: {case.name}: tower over {media.num_patches} patches x {setup.iters}")
    out, tower_t = time_tower(served_tower(tower, setup), pixels, media.grid_thw, setup)
    log(f"vision: {case.name}: tower, per-segment attention loop x {setup.iters}")
    loop = time_loop(tower, pixels, media.grid_thw, out, setup=setup)
    peer_result = None
    if peer is not None:
        log(f"vision: {case.name}: transformers tower x {setup.iters}")
        peer_result = time_peer(peer, pixels, media.grid_thw, out, setup=setup)
    flops = roofline.vision_flops(setup.config, [media.grid_thw])
    return VisionRow(
        case=case.name,
        kind=case.kind,
        media_bytes=num_bytes,
        grid_thw=media.grid_thw,
        expected_grid=case.expected_grid,
        num_patches=media.num_patches,
        num_tokens=media.num_tokens,
        num_output_rows=out.shape[0],
        prep=prep,
        tower=tower_t,
        peer=peer_result,
        gflop=flops / 1e9,
        roofline_ms=flops / peaks.matmul_flop_s * 1e3,
        loop=loop,
    )


def measure_peaks(device: torch.device) -> tuple[roofline.Peaks, int]:
    """The device's peaks, and the matmul size they were measured at (small on a CPU)."""
    log("vision: measuring copy bandwidth and matmul rate")
    is_cuda = device.type == "cuda"
    matmul_n = 8192 if is_cuda else 512
    peaks = roofline.measure_peaks(device, copy_mib=1024 if is_cuda else 64, matmul_n=matmul_n)
    return peaks, matmul_n


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    """The `vision` mode: peaks, then per case preprocessing, our tower and the peer."""
    device = resolve_device(args.device)
    setup = TowerSetup(
        VISION_TINY if args.tiny else VISION_27B,
        device,
        torch.bfloat16 if device.type == "cuda" else torch.float32,
        args.warmup,
        args.iters,
    )
    peaks, matmul_n = measure_peaks(device)
    log(f"vision: building the tower ({setup.config.depth} blocks, {setup.dtype}, random weights)")
    tower = build_tower(setup, seed=0)
    peer, peer_note = (None, "transformers peer skipped (--skip-hf)")
    if not args.skip_hf:
        log("vision: building the transformers peer")
        peer, peer_note = build_hf_peer(tower, setup)
    cases = vision_media.TINY_CASES if args.tiny else vision_media.FULL_CASES
    rows = [
        measure_case(case, tower, peer, peaks, setup=setup, seed=i) for i, case in enumerate(cases)
    ]
    num_params = sum(p.numel() for p in tower.parameters())
    context = vision_report.context(
        "tiny vision tower (--tiny; not comparable)" if args.tiny else "Qwen3.8-27B vision tower",
        setup.config,
        f"{device} {str(setup.dtype).removeprefix('torch.')}",
        num_params,
        warmup=args.warmup,
        iters=args.iters,
    )
    raw = {
        "peaks": dataclasses.asdict(peaks),
        "matmul_n": matmul_n,
        "tower_config": dataclasses.asdict(setup.config),
        "peer": peer_note,
        "rows": [r.as_dict() for r in rows],
    }
    return Report(
        "vision",
        info,
        context,
        vision_report.tables(rows, peaks, matmul_n=matmul_n, peer_note=peer_note),
        vision_report.plots(rows),
        raw,
        [vision_report.grid_gate(rows)],
    )
