"""MRoPE position triples (t, h, w) for a prompt with image and video pad tokens (docs/model.md §8).

Text tokens get t = h = w = the running position. A run of pad tokens is one image, or one
temporal group of a video, laid on its merged grid: t = p, h = p + row, w = p + col, where p is the
run's start position; text resumes at p + max(rows, cols), not at p + the run's length. After the
prompt, the token at cache index n has position n + rope_delta on all three axes. Which rotary
frequency reads which axis (the interleaving) is the rotary layer's business.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch


class RopePositions(NamedTuple):
    """positions: [3, T] int64 (t, h, w); rope_delta: (max position + 1) - T, for decode."""

    positions: torch.Tensor
    rope_delta: int


def get_rope_positions(
    input_ids: Sequence[int] | torch.Tensor | np.ndarray,
    image_grids: Sequence[tuple[int, int, int]],
    video_grids: Sequence[tuple[int, int, int]],
    *,
    image_token_id: int,
    video_token_id: int,
    spatial_merge_size: int = 2,
) -> RopePositions:
    """Position triples of a whole prompt (all its chunks) and its decode offset.

    Args:
        input_ids: the expanded prompt, [T].
        image_grids: (t, h, w) in patches of each image, in prompt order (t = 1).
        video_grids: (t, h, w) of each video, in prompt order; each of its t temporal groups is
            one run of pad tokens, preceded by its own timestamp text and vision_start.
        image_token_id, video_token_id: the `<|image_pad|>` / `<|video_pad|>` ids.
        spatial_merge_size: patches per merged token along each side (2).
    Returns:
        RopePositions(positions [3, T] int64, rope_delta).
    Raises:
        ValueError if the pad-token runs do not match the grids in count or length.
    """
    ids = np.asarray(input_ids.cpu() if isinstance(input_ids, torch.Tensor) else input_ids)
    ids = ids.astype(np.int64).reshape(-1)
    kinds = np.where(ids == image_token_id, 1, np.where(ids == video_token_id, 2, 0))
    groups = {
        1: iter([("image", i, _grid(g)) for i, g in enumerate(image_grids)]),
        2: _video_groups(video_grids),
    }
    out = np.empty((3, len(ids)), dtype=np.int64)
    pos = 0
    for kind, start, end in _runs(kinds):
        if kind == 0:
            out[:, start:end] = np.arange(pos, pos + end - start)
            pos += end - start
            continue
        name, item, (t, h, w) = _next_group(groups[kind], kind, start)
        rows, cols = h // spatial_merge_size, w // spatial_merge_size
        if end - start != t * rows * cols:
            raise ValueError(
                f"{name} {item} has grid {(t, h, w)}, i.e. {t * rows * cols} pad tokens, but the "
                f"run of pad tokens at index {start} has {end - start}: expand the prompt with "
                f"the same grids"
            )
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        out[:, start:end] = np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + pos
        pos += max(rows, cols)
    for kind, name in ((1, "image"), (2, "video")):
        if (left := next(groups[kind], None)) is not None:
            raise ValueError(
                f"{name} {left[1]} has no pad tokens in the prompt: expand the prompt with every "
                f"{name} it was given"
            )
    delta = int(out.max()) + 1 - len(ids) if len(ids) else 0
    return RopePositions(torch.from_numpy(out), delta)


def text_positions(start: int, length: int, rope_delta: int) -> torch.Tensor:
    """[3, length] positions of cache indices start .. start + length - 1 after the prompt:
    index n gets n + rope_delta on all three axes (decode, and chunks past the last image)."""
    return torch.arange(start + rope_delta, start + rope_delta + length).expand(3, -1)


def _runs(kinds: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(kind, start, end) of each maximal run of equal values."""
    if len(kinds) == 0:
        return
    bounds = np.flatnonzero(np.diff(kinds)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(kinds)]])
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        yield int(kinds[s]), s, e


def _video_groups(
    video_grids: Sequence[tuple[int, int, int]],
) -> Iterator[tuple[str, int, tuple[int, int, int]]]:
    """Each video split into its t temporal groups of grid (1, h, w)."""
    for i, grid in enumerate(video_grids):
        t, h, w = _grid(grid)
        for _ in range(t):
            yield "video", i, (1, h, w)


def _grid(grid: Sequence[int]) -> tuple[int, int, int]:
    t, h, w = (int(v) for v in grid)
    return t, h, w


def _next_group(
    groups: Iterator[tuple[str, int, tuple[int, int, int]]], kind: int, start: int
) -> tuple[str, int, tuple[int, int, int]]:
    item = next(groups, None)
    if item is None:
        name = "image" if kind == 1 else "video"
        raise ValueError(
            f"the run of {name} pad tokens at index {start} has no {name} grid left: pass one "
            f"grid per {name} (a video's t groups each make one run)"
        )
    return item
