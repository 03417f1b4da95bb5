"""The vision tower under CUDA graphs, one per set of grids (runner-internal).

One image's tower call is a few hundred small launches (27 blocks of norms, GEMMs, rotary and
attention), so eagerly it is bound by the host's launch rate, not the GPU. A call over grids seen
before replays the graph captured for them; one over new grids is captured on the spot (a warm-up
run, then the capture) while the graphs kept are fewer than `max_graphs`, least recently used out
after that. Calls of more than `max_patches` patches run eagerly: there the GPU's work dwarfs the
launches. Every graph shares one memory pool (they replay one at a time on one stream), so their
memory is about the largest one's; each replay's output is copied out before the next.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sparkinfer.model.vision import TowerPlan, VisionModel
from sparkinfer.scheduler.errors import GraphCaptureError
from sparkinfer.scheduler.graphs.capture import no_collection

logger = logging.getLogger(__name__)
Grids = tuple[tuple[int, int, int], ...]


@dataclass
class _TowerGraph:
    graph: torch.cuda.CUDAGraph
    pixels: torch.Tensor  # the static input every replay reads
    plan: TowerPlan  # the positions the graph reads, kept alive with it
    output: torch.Tensor  # written by each replay


class TowerGraphs:
    """`tower(pixel_values, grid_thw)` with replays for the grids it has captured."""

    def __init__(self, tower: VisionModel, *, max_patches: int, max_graphs: int = 16) -> None:
        self.tower = tower
        self.max_patches = max_patches
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Grids, _TowerGraph] = OrderedDict()
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def __call__(
        self, pixel_values: torch.Tensor, grid_thw: Sequence[tuple[int, int, int]]
    ) -> torch.Tensor:
        """The tower's rows for these items (a new tensor), by replay where the grids allow."""
        grids: Grids = tuple((int(t), int(h), int(w)) for t, h, w in grid_thw)
        entry = self._graphs.get(grids)
        if entry is None:
            if sum(t * h * w for t, h, w in grids) > self.max_patches or self.max_graphs <= 0:
                return self.tower(pixel_values, grids)
            entry = self._capture(pixel_values, grids)
        self._graphs.move_to_end(grids)
        entry.pixels.copy_(pixel_values, non_blocking=True)
        entry.graph.replay()
        return entry.output.clone()

    def _capture(self, pixel_values: torch.Tensor, grids: Grids) -> _TowerGraph:
        plan = self.tower.plan(grids)
        device = self.tower.pos_embed.weight.device
        pixels = torch.empty(pixel_values.shape, dtype=pixel_values.dtype, device=device)
        self.tower.forward(pixels.zero_(), grids)  # checks the shapes; builds kernel variants
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)
        # captured on a side stream (the caller's may be the default one, which cannot capture)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph()
        try:
            with no_collection(), torch.cuda.graph(graph, pool=self._pool, stream=stream):
                output = self.tower.encode(pixels, plan)
        except RuntimeError as exc:
            raise GraphCaptureError(
                f"capturing the vision tower for grids {list(grids)} failed ({exc}): set "
                "enforce_eager=True"
            ) from exc
        entry = _TowerGraph(graph, pixels, plan, output)
        self._graphs[grids] = entry
        logger.info("captured the vision tower for grids %s", list(grids))
        return entry
