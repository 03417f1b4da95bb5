"""Runner-side media: vision tower rows kept across a request's prefill chunks, and positions.

A multimodal request's images and videos go through the vision tower once, at its first prefill
chunk (the items it still needs, in prompt order, one call). The rows are kept until the chunk
that ends the prompt, and each chunk takes the slice for its own pad tokens: the rows of the pads
before the chunk are skipped. A preempted request starts again from its first chunk, so its rows
are recomputed rather than held while it waits.

Reuse: items with content hashes take their rows from the `VisionCache` when it holds them (only
the others run through the tower), and a prompt that starts from a cached prefix needs no rows
for the items wholly inside that prefix.

On a GPU the tower runs under `TowerGraphs`: calls over grids seen before replay a CUDA graph.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from sparkinfer.model.vision import VisionModel, merge_vision_embeddings
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.errors import InvalidRequest
from sparkinfer.scheduler.request import MultimodalInputs, Request, RequestStatus
from sparkinfer.scheduler.sampler import host_list
from sparkinfer.scheduler.vision.cache import VisionCache
from sparkinfer.scheduler.vision.graphs import TowerGraphs


@dataclass(frozen=True)
class _Rows:
    """One request's tower output and where its pad tokens sit in the prompt."""

    req: Request
    rows: torch.Tensor  # [pad tokens from first_pad on, hidden] on the device, in prompt order
    is_pad_cpu: torch.Tensor  # [num_prompt_tokens] bool
    pads_before_cpu: list[int]  # [num_prompt_tokens + 1] pad tokens before each index
    first_pad: int = 0  # pad tokens of the prompt before rows[0] (items inside a cached prefix)


class VisionInputs:
    """Owns the vision rows of requests in prefill (runner-internal)."""

    def __init__(
        self,
        model: CausalLM,
        device: torch.device,
        cache_bytes: int = 0,
        *,
        graph_patches: int = 0,
    ) -> None:
        self.model = model
        self.cache = VisionCache(cache_bytes)
        self.device = device
        visual = getattr(model, "visual", None)
        self.visual: VisionModel | None = visual
        self.tower: Callable[[torch.Tensor, list[tuple[int, int, int]]], torch.Tensor] | None = (
            TowerGraphs(visual, max_patches=graph_patches)
            if visual is not None and graph_patches > 0 and device.type == "cuda"
            else visual
        )
        config = getattr(model, "config", None)
        self.pad_ids = (
            (int(config.image_token_id), int(config.video_token_id))
            if visual is not None and config is not None
            else None
        )
        self.merge_size = int(getattr(visual, "merge_size", 1))
        self._rows: dict[str, _Rows] = {}

    @property
    def num_held(self) -> int:
        """Requests whose rows are held (between their first and last prefill chunk)."""
        return len(self._rows)

    def check(self, prompt_token_ids: Sequence[int], mm: MultimodalInputs) -> None:
        """Raise InvalidRequest unless the model can run `mm` with this prompt."""
        if self.visual is None or self.pad_ids is None:
            raise InvalidRequest(
                "the request has images or videos but this model has no vision tower: "
                "send text only, or serve a checkpoint with a vision_config"
            )
        patch_dim = self.visual.patch_embed.proj.weight[0].numel()
        if mm.pixel_values.shape[1] != patch_dim:
            raise InvalidRequest(
                f"pixel_values rows have {mm.pixel_values.shape[1]} values; the vision tower "
                f"takes {patch_dim}: preprocess with the checkpoint's patch geometry"
            )
        for kind, pad_id in zip(("image", "video"), self.pad_ids, strict=True):
            want = sum(
                t * (h // self.merge_size) * (w // self.merge_size)
                for (t, h, w), k in zip(mm.grid_thw, mm.kinds, strict=True)
                if k == kind
            )
            got = sum(1 for t in prompt_token_ids if t == pad_id)
            if got != want:
                raise InvalidRequest(
                    f"the prompt has {got} {kind} pad tokens (id {pad_id}); its {kind}s fill "
                    f"{want}: expand the prompt with the same grids"
                )
        if mm.content_hashes:
            self._check_runs(prompt_token_ids, mm)
        if mm.positions is not None and tuple(mm.positions.shape) != (3, len(prompt_token_ids)):
            raise InvalidRequest(
                f"multimodal positions have shape {tuple(mm.positions.shape)}; the prompt needs "
                f"(3, {len(prompt_token_ids)})"
            )

    def _check_runs(self, prompt_token_ids: Sequence[int], mm: MultimodalInputs) -> None:
        """The pad runs cover exactly the prompt's pad tokens, each item's tokens in order: the
        prefix cache keys pads by them, so a wrong run could make two images look alike."""
        assert self.pad_ids is not None, "checked before"
        want = [t * (h // self.merge_size) * (w // self.merge_size) for t, h, w in mm.grid_thw]
        got = [0] * len(want)
        end, item_idx, covered = 0, 0, 0
        for start, stop, idx in mm.pad_runs:
            is_valid = (
                end <= start < stop <= len(prompt_token_ids)
                and item_idx <= idx < len(want)
                and all(t in self.pad_ids for t in prompt_token_ids[start:stop])
            )
            if not is_valid:
                raise InvalidRequest(
                    f"multimodal pad run ({start}, {stop}, {idx}) is out of order or covers "
                    "tokens that are not pads: build pad_runs from the expanded prompt"
                )
            got[idx] += stop - start
            end, item_idx, covered = stop, idx, covered + stop - start
        num_pads = sum(1 for t in prompt_token_ids if t in self.pad_ids)
        if got != want or covered != num_pads:
            raise InvalidRequest(
                f"multimodal pad runs cover {got} tokens per item of the prompt's {num_pads} "
                f"pads; the items fill {want}: build pad_runs from the expanded prompt"
            )

    def prepare(self, seqs: Sequence[ScheduledSeq]) -> None:
        """Drop rows of requests that left prefill; one tower call for the step's first chunks."""
        for request_id, held in list(self._rows.items()):
            if held.req.status is not RequestStatus.RUNNING:  # finished, aborted or preempted
                del self._rows[request_id]
        starts: list[tuple[Request, int]] = []
        for seq in seqs:
            req = seq.req
            if req.multimodal is None or not _in_prompt(seq):
                continue
            held = self._rows.get(req.request_id)
            is_new = (
                held is None
                or held.req is not req
                or held.first_pad > held.pads_before_cpu[seq.num_cached_tokens]  # restarted
            )
            if is_new:
                starts.append((req, seq.num_cached_tokens))
        if starts:
            self._encode_step(starts)

    def embeddings(
        self, seqs: Sequence[ScheduledSeq], input_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """Token embeddings of a packed step with vision rows merged in (None: no media in it)."""
        if not any(_has_media(s) for s in seqs):
            return None
        embeds = self.model.embed_input_ids(input_ids)  # [T, hidden]
        row = 0
        for seq in seqs:
            if _has_media(seq):
                self._merge(seq, embeds[row : row + seq.num_new_tokens])
            row += seq.num_new_tokens
        return embeds

    def _merge(self, seq: ScheduledSeq, embeds: torch.Tensor) -> None:
        """Write the chunk's share of its request's rows into its pad-token embeddings."""
        held = self._rows.get(seq.req.request_id)
        if held is None or held.req is not seq.req:
            raise RuntimeError(
                f"request {seq.req.request_id} continues its prompt at token "
                f"{seq.num_cached_tokens} but its vision rows are gone"
            )
        start = seq.num_cached_tokens
        end = min(start + seq.num_new_tokens, seq.req.num_prompt_tokens)
        first, last = held.pads_before_cpu[start], held.pads_before_cpu[end]
        if last > first:
            is_pad = held.is_pad_cpu[start:end].to(self.device, non_blocking=True)
            rows = held.rows[first - held.first_pad : last - held.first_pad]
            merge_vision_embeddings(embeds[: end - start], is_pad, rows)
        if end == seq.req.num_prompt_tokens:  # the prompt is done: free the rows
            del self._rows[seq.req.request_id]

    def clear(self) -> None:
        self._rows.clear()
        self.cache.clear()

    def _encode_step(self, starts: Sequence[tuple[Request, int]]) -> None:
        """Rows for each (request, prompt index it starts at): the items with pads at or after
        that index (the rest lie in a cached prefix), from the cache where it has them, and the
        others of every request of the step in one tower call (an item two requests send, once)."""
        assert self.visual is not None, "checked at add_request"
        plans = [self._plan(req, start) for req, start in starts]
        found: dict[object, torch.Tensor] = {}
        todo: dict[object, tuple[MultimodalInputs, int]] = {}
        for plan in plans:
            for key, i in zip(plan.keys, plan.needed, strict=True):
                cached = self.cache.get(key) if isinstance(key, str) else None
                if cached is not None:
                    found[key] = cached
                elif key not in found:
                    todo.setdefault(key, (plan.mm, i))
        if todo:
            pixels = torch.cat([_item_pixels(mm, i) for mm, i in todo.values()])
            grids = [mm.grid_thw[i] for mm, i in todo.values()]
            assert self.tower is not None
            out = self.tower(pixels, grids)  # one copy to the device, in the tower
            sizes = [t * (h // self.merge_size) * (w // self.merge_size) for t, h, w in grids]
            item_rows: list[torch.Tensor] = [out[a:b] for a, b in itertools.pairwise(
                itertools.accumulate(sizes, initial=0))]  # fmt: skip
            for key, rows in zip(todo, item_rows, strict=True):
                found[key] = rows
                if isinstance(key, str) and self.cache.max_bytes:
                    self.cache.put(key, rows.clone())
        for plan in plans:
            rows = [found[key] for key in plan.keys]
            self._rows[plan.req.request_id] = _Rows(
                plan.req,
                torch.cat(rows) if rows else torch.empty(0, device=self.device),
                plan.is_pad_cpu,
                plan.pads_before_cpu,
                plan.first_pad,
            )

    def _plan(self, req: Request, start: int) -> _Plan:
        assert self.pad_ids is not None and req.multimodal is not None, "checked at add_request"
        mm = req.multimodal
        prompt = torch.tensor(req.token_ids[: req.num_prompt_tokens], dtype=torch.int64)
        is_pad = (prompt == self.pad_ids[0]) | (prompt == self.pad_ids[1])
        pads_before: list[int] = [0, *host_list(torch.cumsum(is_pad, 0))]
        m = self.merge_size
        num_tokens = [t * (h // m) * (w // m) for t, h, w in mm.grid_thw]
        token_end = list(itertools.accumulate(num_tokens))
        assert pads_before[-1] == token_end[-1], "pad count checked at add_request"
        needed = [i for i, e in enumerate(token_end) if e > pads_before[start]]
        first_pad = token_end[needed[0]] - num_tokens[needed[0]] if needed else token_end[-1]
        hashes = mm.content_hashes
        keys = [hashes[i] if hashes else (req.request_id, i) for i in needed]
        return _Plan(req, mm, is_pad, pads_before, needed, keys, first_pad)


@dataclass(frozen=True)
class _Plan:
    """What one request starting its prompt needs from the tower: the items `needed` (by index),
    each under its key (its content hash, or the request and index when it has none)."""

    req: Request
    mm: MultimodalInputs
    is_pad_cpu: torch.Tensor
    pads_before_cpu: list[int]
    needed: list[int]
    keys: Sequence[object]
    first_pad: int


def _item_pixels(mm: MultimodalInputs, item_idx: int) -> torch.Tensor:
    """The patch rows of item `item_idx`: [t * h * w, patch_dim]."""
    start = sum(t * h * w for t, h, w in mm.grid_thw[:item_idx])
    t, h, w = mm.grid_thw[item_idx]
    return mm.pixel_values[start : start + t * h * w]


def _in_prompt(seq: ScheduledSeq) -> bool:
    return seq.num_cached_tokens < seq.req.num_prompt_tokens


def _has_media(seq: ScheduledSeq) -> bool:
    """The chunk holds prompt tokens of a request with images or videos."""
    return seq.req.multimodal is not None and _in_prompt(seq)


def seq_positions(seq: ScheduledSeq) -> torch.Tensor:
    """[3, num_new_tokens] (t, h, w) positions of one chunk.

    Prompt tokens of a multimodal request take its MRoPE positions; every other token at cache
    index n takes n + rope_delta on all three axes (rope_delta is 0 for text requests).
    """
    start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_new_tokens
    mm = seq.req.multimodal
    num_prompt = seq.req.num_prompt_tokens
    if mm is None or mm.positions is None or start >= num_prompt:
        return torch.arange(start, end).add_(seq.req.rope_delta).expand(3, -1)
    prompt_part = mm.positions[:, start : min(end, num_prompt)]
    if end <= num_prompt:
        return prompt_part
    after = torch.arange(num_prompt, end).add_(mm.rope_delta).expand(3, -1)
    return torch.cat([prompt_part, after], dim=1)


def step_positions(seqs: Sequence[ScheduledSeq]) -> torch.Tensor:
    """Positions of a packed step (host): [3, T] when a chunk holds MRoPE prompt positions, else
    [T] (the same rotation: rope with all three axes equal is plain 1-D rope)."""
    needs_axes = any(
        s.req.multimodal is not None and s.req.multimodal.positions is not None and _in_prompt(s)
        for s in seqs
    )
    if needs_axes:
        return torch.cat([seq_positions(s) for s in seqs], dim=1)
    return torch.cat(
        [
            torch.arange(s.num_cached_tokens, s.num_cached_tokens + s.num_new_tokens)
            + s.req.rope_delta
            for s in seqs
        ]
    )
