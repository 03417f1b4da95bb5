"""The vision tower's CUDA graphs (GPU): replays equal the eager tower bit for bit, per grid."""

from __future__ import annotations

import pytest
import torch
from sparkinfer.model.config import VisionConfig
from sparkinfer.model.vision import VisionModel
from sparkinfer.scheduler.vision.graphs import TowerGraphs

pytestmark = pytest.mark.gpu

# real patch geometry and head dim (72, as the 27B tower), 2 narrow blocks
CONFIG = VisionConfig(
    depth=2,
    hidden_size=144,
    num_heads=2,
    intermediate_size=96,
    out_hidden_size=64,
    num_position_embeddings=64,
)


@pytest.fixture(scope="module")
def tower() -> VisionModel:
    torch.manual_seed(0)
    model = VisionModel(CONFIG, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    return model.eval()


def _pixels(grids: list[tuple[int, int, int]], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    n = sum(t * h * w for t, h, w in grids)
    return torch.randn(n, 3 * 2 * 16 * 16, generator=gen).cuda()


def test_replays_equal_the_eager_tower_for_new_pixels(tower) -> None:
    graphs = TowerGraphs(tower, max_patches=4096)
    image, video = [(1, 8, 12)], [(3, 8, 8), (1, 4, 4)]
    for seed, grids in enumerate([image, video, image, video, image]):
        pixels = _pixels(grids, seed)
        got = graphs(pixels, grids)
        assert torch.equal(got, tower(pixels, grids)), grids
    assert graphs.num_graphs == 2


def test_big_calls_run_eagerly_and_old_graphs_leave(tower) -> None:
    graphs = TowerGraphs(tower, max_patches=64, max_graphs=2)
    big = [(1, 8, 12)]
    assert torch.equal(graphs(_pixels(big, 0), big), tower(_pixels(big, 0), big))
    assert graphs.num_graphs == 0
    for side in (2, 4, 6):
        grids = [(1, side, side)]
        pixels = _pixels(grids, side)
        assert torch.equal(graphs(pixels, grids), tower(pixels, grids))
    assert graphs.num_graphs == 2  # the 2x2 grid's graph left first
