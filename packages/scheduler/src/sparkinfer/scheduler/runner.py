"""The runner: the only owner of device tensors, caches, streams and CUDA graphs.

`run(batch)` turns the scheduler's bookkeeping into forwards and samples. A step's decode rows
and prompt chunks run as two packed forwards: decode rows keep the recurrent kernels, the decode
attention kernel and their CUDA graphs (in one mixed forward each decode row was a prefill
sequence of one token, and a prompt joining decoding streams stalled them longer,
docs/benchmarks.md). With `deterministic` a row's numerics then never depend on what else
shares the step: each forward runs in its phase's batch-invariant mode
(`kernels.linear.batch_invariant`; the graphs are captured in it), where the linear layers, FP8
ones too, run the kernels' fixed-tile GEMM of the phase and never the per-row-count tables; on
CPU every torch matmul also runs row-blocked at a fixed shape (`_batch_invariant`). Without it,
each forward takes the fastest kernel per shape. Every forward and device step runs under
the config's `KernelTuning` (`on_stream`, `numerics`): dependent launch and the shape table.

Images and videos (`vision.inputs`): the vision tower runs at a request's first prefill chunk,
outside the batch-invariant mode (its rows depend only on the request's own media); each chunk
merges its share into the token embeddings and gets [3, T] MRoPE positions.

Prompt logprobs: a chunk of a request that asked for them also turns the hidden rows that
predict prompt tokens into logprobs (in pieces of `_PROMPT_LOGPROB_ROWS` rows, so a long chunk
never holds [chunk, vocab] logits at once); the scheduler gathers them across chunks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Generator, Sequence

import numpy as np
import torch
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.tuning import kernel_tuning
from sparkinfer.model.cache_spec import CacheSpec, ModelCaches, allocate_caches
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.forward_batch import ForwardBatch, host_to_device
from sparkinfer.scheduler._batch_invariant import BatchInvariantMode
from sparkinfer.scheduler._causal_lm import CausalLM, forward_tapped
from sparkinfer.scheduler._inflight import (
    StepInFlight,
    device_source_rows,
    merge_inflight_inputs,
)
from sparkinfer.scheduler.batch import ModelOutput, SampledToken, ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.cache_plan import plan_cache
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.graphs.decode import DecodeGraphs
from sparkinfer.scheduler.graphs.prefill import PrefillGraphs
from sparkinfer.scheduler.graphs.verify import VerifyGraphs
from sparkinfer.scheduler.observer import StepObserver
from sparkinfer.scheduler.request import MultimodalInputs, TokenLogprob
from sparkinfer.scheduler.sampler import Sampler, token_logprobs
from sparkinfer.scheduler.speculative.step import (
    SpeculativeStep,
    describe_speculation,
    make_drafter,
)
from sparkinfer.scheduler.vision.inputs import VisionInputs, step_positions

logger = logging.getLogger(__name__)

_SAMPLER_COPIES = 8  # fp32 [max_num_seqs, vocab] temporaries the sampler may hold at once
_PROMPT_LOGPROB_ROWS = 256  # prompt rows turned into fp32 [rows, vocab] logits at a time


class Runner:
    """Allocates the caches, captures decode graphs, and runs each step's forwards and sampling."""

    def __init__(
        self,
        model: CausalLM,
        config: SchedulerConfig,
        *,
        device: torch.device | str | None = None,
        drafter: BlockDrafter | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.model = model
        self.observer = observer  # development tools' hook (observer.py); None: nothing
        asked = config.speculative
        config = config.resolve_speculative(
            has_mtp_head=getattr(model, "mtp", None) is not None,
            draft_model_depth=drafter.config.num_drafts if drafter is not None else 0,
        )
        self.config = config  # "auto" made concrete: the engine's scheduler takes this one
        logger.info("%s", describe_speculation(asked, config))
        self.device = torch.device(device) if device else next(model.parameters()).device
        self._is_cuda = self.device.type == "cuda"
        if self._is_cuda:
            config.check_cuda()
        self._stream = torch.cuda.Stream(self.device) if self._is_cuda else None
        self.kernel_tuning = config.kernel_tuning  # every device step runs under it (on_stream)
        spec: CacheSpec = model.cache_spec()
        self.vocab_size, activation_bytes = self._profile(spec)
        budget = self._cache_budget(activation_bytes)
        if drafter is not None and config.speculative == "draft_model":
            # Its K/V pages share the target's block ids: split the budget per token.
            kv, extra = spec.kv_bytes_per_token(), drafter.cache_spec().bytes_per_token()
            budget = budget * kv // max(1, kv + extra)
        self.plan = plan_cache(spec, config, budget_bytes=budget, cap_blocks=True)
        self.config = config = config.resolve_state_slots(self.plan.num_slots)
        logger.info(
            "caches: %d KV blocks of %d tokens, %d state slots",
            self.plan.num_blocks,
            config.block_size,
            self.plan.num_slots,
        )
        with self.on_stream():  # zeroed on the stream that reads and writes them
            self.caches = allocate_caches(
                spec,
                num_blocks=self.plan.num_blocks,
                block_size=config.block_size,
                num_slots=self.plan.num_slots + self.plan.num_snapshots,
                device=self.device,
                num_verify_rows=self.plan.num_verify_rows,
            )
        self.sampler = Sampler(
            eos_token_ids=config.eos_token_ids, device=self.device, seed=config.seed
        )
        self.vision = VisionInputs(
            model,
            self.device,
            config.vision_cache_bytes,
            graph_patches=0 if config.enforce_eager else config.vision_graph_patches,
        )
        self._inflight: StepInFlight | None = None  # the last step, its samples not read yet
        self._is_closed = False
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.verify_graphs: VerifyGraphs | None = None
        with self.on_stream():
            made = make_drafter(
                config, model, self.caches, self.device,
                draft_model=drafter, num_blocks=self.plan.num_blocks,
            )  # fmt: skip
        self.speculative = SpeculativeStep(self, made, observer=observer)
        if self._is_cuda and not config.enforce_eager:
            self.graphs = self._capture_graphs()
            if config.is_speculative:
                self.verify_graphs = self._capture_verify_graphs()
                self.speculative.capture_graphs()
            if config.prefill_graph_sizes():
                self.prefill_graphs = self._capture_prefill_graphs()
        if self._is_cuda and config.is_speculative:
            self.speculative.warm_up()

    @property
    def num_blocks(self) -> int:
        return self.plan.num_blocks

    @property
    def num_slots(self) -> int:
        return self.plan.num_slots

    @property
    def snapshot_rows(self) -> range:
        """State-pool rows after the request slots, where the prefix cache keeps snapshots."""
        return range(self.plan.num_slots, self.plan.num_slots + self.plan.num_snapshots)

    def check_multimodal(self, prompt_token_ids: Sequence[int], mm: MultimodalInputs) -> None:
        """Raise InvalidRequest unless the model can run these images and videos."""
        self.vision.check(prompt_token_ids, mm)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> ModelOutput:
        """Forward every scheduled chunk and sample where a chunk reached its end; return the
        samples the host can read now (see ModelOutput: with `overlap_steps`, the step before's).
        """
        if self._is_closed:
            raise RuntimeError("the runner is closed (its engine shut down): start a new engine")
        inflight, self._inflight = self._inflight, None  # a failed step drops it too
        if batch.is_read_at_once or self.speculative.must_read(batch):
            return self.speculative.run(batch, inflight)  # draft, verify, accept: read at once
        logits: list[torch.Tensor] = []
        sampled: list[ScheduledSeq] = []
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]] = {}
        with self.on_stream():
            self.prepare_step(batch)
        with self.on_stream():
            takes_prompts = self.speculative.observes_prompts_in_flight
            prompt_hidden: torch.Tensor | None = None
            for group in self._groups(batch.seqs):
                with self.numerics(is_decode=all(s.is_decode for s in group)):
                    if takes_prompts and not group[0].is_decode:
                        # MTP: the head takes the prompt's every row on the device (below)
                        out, prompt_hidden = self.forward_eager(
                            group, prompt_logprobs, inflight, all_rows=True
                        )
                        logits.append(out)
                    else:
                        logits.append(self.forward(group, prompt_logprobs, inflight))
                sampled.extend(s for s in group if s.is_sampled)
            decodes = [s for s in batch.seqs if s.is_decode]
            hidden = self.speculative.decode_hidden(decodes)  # MTP: read before a replay
            before: list[tuple[ScheduledSeq, SampledToken]] | None = None
            if inflight is not None and any(Sampler.needs_host_history(s.req) for s in sampled):
                # A logits processor reads every earlier token, so the step before comes to the
                # host first: the wait ends with it, while this step's forward runs.
                before = inflight.resolve()
            now = self._sample(sampled, logits, inflight, before) if sampled else []
            if prompt_hidden is not None:
                prefills = [s for s in batch.seqs if not s.is_decode]
                self.speculative.observe_prompts_in_flight(
                    decodes if hidden is not None else [], hidden, prefills, prompt_hidden,
                    self._inflight,
                )  # fmt: skip
            elif (
                hidden is not None
                and self._inflight is not None
                and len(decodes) == len(batch.seqs)
            ):
                self.speculative.observe_in_flight(batch.seqs, hidden, self._inflight.token_ids)
            if before is None:
                # Read after this step is queued: the wait ends with the step before, not this.
                before = inflight.resolve() if inflight is not None else []
        return ModelOutput(samples=tuple(before + now), prompt_logprobs=prompt_logprobs)

    def _sample(
        self,
        sampled: list[ScheduledSeq],
        logits: list[torch.Tensor],
        inflight: StepInFlight | None,
        resolved: list[tuple[ScheduledSeq, SampledToken]] | None,
    ) -> list[tuple[ScheduledSeq, SampledToken]]:
        """Draw this step's tokens: left in flight when overlapping, else read at once.

        `resolved`: the step before's samples when they were read ahead of this draw (logits
        processors need them); the scheduler has not appended them yet.
        """
        rows = logits[0] if len(logits) == 1 else torch.cat(logits)
        reqs = [s.req for s in sampled]
        idxs = [s.output_idx for s in sampled]
        late: list[torch.Tensor | None] = []  # only penalties read an output still in flight
        if inflight is not None and any(map(Sampler.counts_outputs, reqs)):
            late = inflight.outputs_of(sampled)
        if self.config.overlap_steps:
            known = {seq.req: sample.token_id for seq, sample in resolved or ()}
            pending = [known.get(req) for req in reqs] if known else []
            drawn = self.sampler.draw(rows, reqs, idxs, late, pending)
            self._inflight = StepInFlight(sampled, drawn)
            return []
        return list(zip(sampled, self.sampler.sample(rows, reqs, idxs, late), strict=True))

    def prepare_step(self, batch: ScheduledBatch) -> None:
        """A step's work ahead of its forwards: the scheduler's state copies, and the vision
        tower for requests starting their prompt (call on the runner's stream)."""
        self.copy_states(batch.state_copies)
        self.vision.prepare(batch.seqs)

    def copy_states(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy GDN state rows (conv and recurrent, every layer), one pair after the other:
        a row a prefix-cache snapshot was just taken into may be restored from in the same step.

        Each pair's rows of every layer go in one foreach copy (a few launches, not two per
        layer): the step's forward is launched after them, so their launches delay it.
        """
        caches = list(self.caches.linear.values())
        for src, dst in copies:
            dsts = [c.conv[dst] for c in caches] + [c.recurrent[dst] for c in caches]
            srcs = [c.conv[src] for c in caches] + [c.recurrent[src] for c in caches]
            # torch's batched copy (its optimizers' path) has no public name.
            torch._foreach_copy_(dsts, srcs)  # pyright: ignore[reportPrivateUsage, reportPrivateImportUsage]

    def close(self) -> None:
        """Drop graphs, vision rows, samples in flight and caches so their memory can be reused.

        A closed runner runs no more steps; an engine started after this one (in the same
        process) sizes its caches from the memory this frees.
        """
        self.graphs = None
        self.prefill_graphs = None
        self.verify_graphs = None
        self.speculative.drop_graphs()
        self._inflight = None
        self.vision.clear()
        self.caches = ModelCaches(attention={}, linear={})  # graphs above held views of them
        self._is_closed = True
        if self._is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def _groups(self, seqs: Sequence[ScheduledSeq]) -> list[list[ScheduledSeq]]:
        decodes = [s for s in seqs if s.is_decode]
        prefills = [s for s in seqs if not s.is_decode]
        return [g for g in (decodes, prefills) if g]

    def forward(
        self,
        seqs: list[ScheduledSeq],
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]],
        inflight: StepInFlight | None,
    ) -> torch.Tensor:
        """One packed forward -> logits [num sampled seqs, vocab] fp32; fills prompt_logprobs.

        Rows whose input is the previous step's sample read it from `inflight` on the device.
        """
        is_scoring = any(s.num_prompt_logprobs for s in seqs)
        sources = inflight.source_rows(seqs) if inflight is not None else _no_sources(seqs)
        if self.graphs is not None and all(s.is_decode for s in seqs) and not is_scoring:
            bucket = self.graphs.bucket_for(len(seqs))
            if bucket is not None:
                return self.graphs.run(seqs, bucket, sources, inflight)
        if self.prefill_graphs is not None and not is_scoring:
            bucket = self.prefill_graphs.bucket_for(seqs)
            if bucket is not None:
                return self.prefill_graphs.run(seqs, bucket, sources, inflight)
        return self.forward_eager(seqs, prompt_logprobs, inflight, all_rows=False)[0]

    def forward_eager(
        self,
        seqs: list[ScheduledSeq],
        prompt_logprobs: dict[str, tuple[TokenLogprob, ...]],
        inflight: StepInFlight | None,
        *,
        all_rows: bool,
        use_taps: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One packed eager forward -> (logits [num sampled seqs, vocab] fp32, hidden rows: every
        row [T, hidden] with `all_rows` or prompt logprobs, else the sampled rows'; with
        `use_taps` every row's tapped states [T, taps * hidden] instead)."""
        is_scoring = any(s.num_prompt_logprobs for s in seqs)
        sources = inflight.source_rows(seqs) if inflight is not None else _no_sources(seqs)
        batch = ForwardBatch.build(
            [s.num_new_tokens for s in seqs],
            [s.num_cached_tokens for s in seqs],
            [s.req.block_ids for s in seqs],
            [_slot(s) for s in seqs],
            caches=self.caches,
            block_size=self.config.block_size,
            device=self.device,
            positions=host_to_device(step_positions(seqs), self.device),
            logits_indices=_logits_indices(seqs),
        )
        rows = host_to_device(_step_inputs(seqs, sources), self.device)
        input_ids = merge_inflight_inputs(rows[0], rows[1], inflight)
        embeds = self.vision.embeddings(seqs, input_ids)  # None: no media in this step
        if use_taps:
            hidden, tapped = forward_tapped(self.model, input_ids, batch, inputs_embeds=embeds)
            if is_scoring:
                prompt_logprobs.update(self._score_prompt(seqs, hidden))
            return self.model.compute_logits(hidden[batch.logits_indices]), tapped
        if not (is_scoring or all_rows):  # the last layer's MLP runs on the sampled rows only
            hidden = self.model(input_ids, batch, inputs_embeds=embeds, logits_rows_only=True)
            return self.model.compute_logits(hidden), hidden
        hidden = self.model(input_ids, batch, inputs_embeds=embeds)
        if is_scoring:
            prompt_logprobs.update(self._score_prompt(seqs, hidden))
        return self.model.compute_logits(hidden[batch.logits_indices]), hidden

    def _score_prompt(
        self, seqs: list[ScheduledSeq], hidden: torch.Tensor
    ) -> dict[str, tuple[TokenLogprob, ...]]:
        """Logprobs of the prompt tokens that rows of these chunks predict (hidden [T, hidden])."""
        out: dict[str, tuple[TokenLogprob, ...]] = {}
        start = 0
        for s in seqs:
            num_rows, num_top = s.num_prompt_logprobs, s.req.params.prompt_logprobs or 0
            targets = s.req.token_ids[s.num_cached_tokens + 1 : s.num_cached_tokens + 1 + num_rows]
            entries: list[TokenLogprob] = []
            for i in range(0, num_rows, _PROMPT_LOGPROB_ROWS):
                rows = hidden[start + i : start + min(num_rows, i + _PROMPT_LOGPROB_ROWS)]
                piece = targets[i : i + _PROMPT_LOGPROB_ROWS]
                entries += token_logprobs(self.model.compute_logits(rows), piece, num_top)
            if num_rows:
                out[s.req.request_id] = tuple(entries)
            start += s.num_new_tokens
        return out

    @contextlib.contextmanager
    def numerics(self, *, is_decode: bool) -> Generator[None, None, None]:
        """The kernel tuning, and batch-invariant numerics when `deterministic` asks for them,
        for one forward (or graph capture)."""
        with kernel_tuning(self.kernel_tuning):
            if not self.config.deterministic:
                yield
                return
            cpu_matmuls = contextlib.nullcontext() if self._is_cuda else BatchInvariantMode()
            with batch_invariant("decode" if is_decode else "prefill"), cpu_matmuls:
                yield

    @contextlib.contextmanager
    def on_stream(self) -> Generator[None, None, None]:
        """The runner's stream and kernel tuning, for every device step (tower, drafts, copies)."""
        with kernel_tuning(self.kernel_tuning):
            if self._stream is None:
                yield
            else:
                with torch.cuda.stream(self._stream):
                    yield

    @torch.inference_mode()
    def _profile(self, spec: CacheSpec) -> tuple[int, int]:
        """Run the largest prefill once on scratch caches -> (vocab size, peak activation bytes).

        On CUDA the prompt chunks of `kernel_warmup_lengths` run next on the same caches, so
        every size-dependent kernel variant is built before the first request, not in it.
        """
        cfg = self.config
        num_tokens = min(cfg.max_num_batched_tokens, cfg.max_model_len) if self._is_cuda else 1
        num_blocks = -(-num_tokens // cfg.block_size)
        scratch = allocate_caches(
            spec, num_blocks=num_blocks, block_size=cfg.block_size, num_slots=1, device=self.device
        )
        if self._is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = torch.cuda.memory_allocated(self.device) if self._is_cuda else 0
        batch = ForwardBatch.build(
            [num_tokens], [0], [list(range(num_blocks))], [0],
            caches=scratch, block_size=cfg.block_size, device=self.device,
        )  # fmt: skip
        with self.on_stream(), self.numerics(is_decode=False):
            ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
            hidden = self.model(ids, batch)
            vocab_size = self.model.compute_logits(hidden[-1:]).shape[1]
        if not self._is_cuda:
            return vocab_size, 0
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - start
        del hidden, batch
        with self.on_stream(), self.numerics(is_decode=False):
            self._warm_up_kernels(scratch, num_tokens)
        del scratch
        torch.cuda.empty_cache()
        return vocab_size, peak

    def _warm_up_kernels(self, scratch: ModelCaches, max_tokens: int) -> None:
        """One forward of each of the model's `kernel_warmup_lengths` on the scratch caches."""
        lengths = self.model.kernel_warmup_lengths(max_tokens)
        logger.info("building kernel variants: prompt chunks of %s tokens", list(lengths))
        num_blocks = -(-max_tokens // self.config.block_size)
        for num_tokens in lengths:
            batch = ForwardBatch.build(
                [num_tokens], [0], [list(range(num_blocks))], [0],
                caches=scratch, block_size=self.config.block_size, device=self.device,
            )  # fmt: skip
            self.model(torch.zeros(num_tokens, dtype=torch.int64, device=self.device), batch)
        torch.cuda.synchronize(self.device)

    def _cache_budget(self, activation_bytes: int) -> int:
        if not self._is_cuda:
            return self.config.cpu_cache_bytes
        free, total = torch.cuda.mem_get_info(self.device)
        sampler = _SAMPLER_COPIES * self.config.max_num_seqs * self.vocab_size * 4
        used = total - free  # weights, CUDA context and anything else on the device
        return int(total * self.config.gpu_memory_utilization) - used - activation_bytes - sampler

    def _capture_graphs(self) -> DecodeGraphs:
        assert self._stream is not None
        max_batch = self.config.max_seqs_per_step
        graphs = DecodeGraphs(
            self.model,
            self.caches,
            batch_sizes=self.config.graph_batch_sizes(max_batch),
            max_blocks_per_seq=self.config.max_blocks_per_seq,
            block_size=self.config.block_size,
            stream=self._stream,
            use_taps=self.speculative.needs_taps,
            observer=self.observer,
        )
        logger.info("capturing decode CUDA graphs for %s", graphs.batch_sizes)
        with torch.inference_mode(), self.numerics(is_decode=True):
            graphs.capture()
        return graphs

    def _capture_verify_graphs(self) -> VerifyGraphs | None:
        """One verify graph per decode bucket whose rows, k + 1 a sequence, fit the verify
        stashes (None: every verify runs eagerly)."""
        assert self._stream is not None
        cfg = self.config
        rows_per_seq = cfg.num_speculative_tokens + 1
        sizes = [
            b
            for b in cfg.graph_batch_sizes(cfg.max_seqs_per_step)
            if b * rows_per_seq <= self.plan.num_verify_rows
        ]
        if not sizes:
            logger.info("no verify graph: %d verify rows hold no bucket", self.plan.num_verify_rows)
            return None
        graphs = VerifyGraphs(
            self.model,
            self.caches,
            batch_sizes=sizes,
            num_drafts=cfg.num_speculative_tokens,
            max_rows=self.plan.num_verify_rows,
            max_blocks_per_seq=cfg.max_blocks_per_seq,
            block_size=cfg.block_size,
            stream=self._stream,
            use_taps=self.speculative.needs_taps,
        )
        logger.info("capturing verify CUDA graphs for %s", graphs.batch_sizes)
        with torch.inference_mode(), self.numerics(is_decode=True):
            graphs.capture()
        return graphs

    def _capture_prefill_graphs(self) -> PrefillGraphs:
        assert self._stream is not None
        graphs = PrefillGraphs(
            self.model,
            self.caches,
            token_sizes=self.config.prefill_graph_sizes(),
            max_seqs=self.config.max_seqs_per_step,
            max_blocks_per_seq=self.config.max_blocks_per_seq,
            block_size=self.config.block_size,
            stream=self._stream,
        )
        logger.info("capturing prefill CUDA graphs for %s tokens", graphs.token_sizes)
        with torch.inference_mode(), self.numerics(is_decode=False):
            graphs.capture()
        return graphs


def _no_sources(seqs: Sequence[ScheduledSeq]) -> list[int | None]:
    if any(s.is_input_inflight for s in seqs):
        raise RuntimeError("a row's input token is in flight, but no step is: step results lost")
    return [None] * len(seqs)


def _step_inputs(seqs: Sequence[ScheduledSeq], sources: Sequence[int | None]) -> torch.Tensor:
    """[2, T] int64 host rows of the packed step: each token's id (0 where the input is still in
    flight) and the in-flight row that feeds it (-1 where the id is known)."""
    num_new = [s.num_new_tokens for s in seqs]
    chunks = ([0] if s.is_input_inflight else s.new_token_ids for s in seqs)
    rows = np.empty((2, sum(num_new)), dtype=np.int64)
    rows[0] = np.fromiter(
        itertools.chain.from_iterable(chunks), dtype=np.int64, count=rows.shape[1]
    )
    rows[1] = np.repeat(np.asarray(device_source_rows(sources), dtype=np.int64), num_new)
    return torch.as_tensor(rows)


def _slot(seq: ScheduledSeq) -> int:
    assert seq.req.state_slot is not None, f"{seq.req.request_id} runs without a state slot"
    return seq.req.state_slot


def _logits_indices(seqs: Sequence[ScheduledSeq]) -> list[int]:
    """Last row of each sequence whose chunk reaches its end."""
    out: list[int] = []
    end = 0
    for s in seqs:
        end += s.num_new_tokens
        if s.is_sampled:
            out.append(end - 1)
    return out
