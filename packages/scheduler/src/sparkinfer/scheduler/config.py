"""Engine settings: one frozen, validated dataclass (no torch here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The output block of the GDN prefill kernels (two 64-token chunks share one stored state): with
# `deterministic`, prompt chunks are cut only at multiples of it, so where the budget cuts a
# prompt never changes the prompt's numerics (kernels.gated_delta_rule's README, contract).
PREFILL_CHUNK_ALIGNMENT = 128
# Decode batch sizes that get a CUDA graph: small sizes dense, larger ones every 16 then 32 rows.
_GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128)
# Prompt-chunk forwards that get a CUDA graph: token counts from the first doubling up to the
# second, then every third up to `prefill_graph_tokens`. Past about 180 rows the 27B model's
# GEMMs are compute-bound on an H200, so padding a step to the next bucket costs device time:
# steps of 64 keep it under 64 rows.
_PREFILL_GRAPH_MIN_TOKENS, _PREFILL_GRAPH_DOUBLING_UNTIL, _PREFILL_GRAPH_STEP = 16, 128, 64
SPECULATIVE_METHODS = ("off", "ngram", "mtp")


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine batches, caches and runs.

    max_num_seqs: most sequences in one step (also bounded by the state slots that fit).
    max_model_len: context window: prompt + generated tokens.
    max_num_batched_tokens: token budget of one step (decodes first, then prefill chunks).
    max_queue_depth: most waiting requests before `add_request` raises QueueFull (0: unlimited).
    block_size: tokens per KV page.
    gpu_memory_utilization: fraction of the GPU's memory the process may use (weights included).
    num_kv_blocks / num_state_slots: explicit cache sizes; None sizes them from memory on CUDA
        and from `cpu_cache_bytes` on CPU.
    cpu_cache_bytes: cache budget on CPU when the sizes are not given.
    enforce_eager: never capture CUDA graphs.
    prefill_graph_tokens: largest forward of a step's prompt chunks (tokens) replayed from a
        CUDA graph instead of launched eagerly (`prefill_graphs`); the host needs longer to launch
        a forward than the device needs to run a few hundred tokens. 0 captures none.
    overlap_steps: queue each step before reading the previous step's samples, so the host
        schedules step N+1 while the device runs step N (a decode row takes its input token from
        the device; penalties count it there); a step with a logits processor is read at once.
        Tokens, and greedy outputs, are the same either way; outputs reach callbacks one step
        later, and a request that stops on a sampled token has run one extra row.
    dependent_launch: launch the Triton kernels of a step as programmatic dependents (Hopper and
        later; `kernels.dependent_launch`), so each one's launch overlaps the tail of the kernel
        before it. Outputs are the same either way.
    deterministic: batch-invariant numerics: decode and prefill rows run as separate forwards
        with fixed-shape matmuls (fixed-tile Triton GEMMs on CUDA, row-blocked on CPU), and a
        prompt chunk that leaves prompt behind ends on a multiple of `chunk_alignment`.
    eos_token_ids: the model's end-of-sequence ids (from its generation defaults).
    seed: seed of the sampler's shared generator (unseeded requests).
    prefix_cache_snapshots: GDN state snapshots kept for prefix reuse (`prefix_cache`); 0 turns
        the prefix cache off. Each is one sequence's conv and recurrent state (147 MiB at 27B),
        taken from the cache memory like a state slot.
    prefix_cache_min_tokens: fewest new tokens worth a snapshot: a prompt's prefill ends a chunk
        at a checkpoint (`prefix_cache`) only this far or more past the cached part before it.
    speculative: speculative decoding's drafter (`spec_decode`): "off", "ngram" (prompt lookup:
        drafts copied from the request's own tokens) or "mtp" (the checkpoint's MTP head).
    num_speculative_tokens: most drafts verified per request and step.
    speculative_max_seqs: most requests verified in one step; each needs
        num_speculative_tokens state rows for its roll-back points (147 MiB each at 27B).
    speculative_adaptive: stop drafting for a request whose drafts are rarely accepted, and in
        steps where the measured step times say verifying costs more than it brings
        (`spec_policy`); off: every eligible request drafts every step (tests, benchmarks).
    """

    max_num_seqs: int = 64
    max_model_len: int = 32768
    max_num_batched_tokens: int = 2048
    max_queue_depth: int = 0
    block_size: int = 64
    gpu_memory_utilization: float = 0.90
    num_kv_blocks: int | None = None
    num_state_slots: int | None = None
    cpu_cache_bytes: int = 1 << 30
    enforce_eager: bool = False
    prefill_graph_tokens: int = 512
    overlap_steps: bool = True
    dependent_launch: bool = True
    deterministic: bool = False
    eos_token_ids: tuple[int, ...] = ()
    seed: int = 0
    prefix_cache_snapshots: int = 0
    prefix_cache_min_tokens: int = 1024
    speculative: str = "off"
    num_speculative_tokens: int = 3
    speculative_max_seqs: int = 8
    speculative_adaptive: bool = True

    def __post_init__(self) -> None:
        positive = {
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "cpu_cache_bytes": self.cpu_cache_bytes,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} is {value}; it must be >= 1")
        if self.prefix_cache_snapshots < 0 or self.prefix_cache_min_tokens < 1:
            raise ValueError(
                f"prefix_cache_snapshots is {self.prefix_cache_snapshots} and "
                f"prefix_cache_min_tokens {self.prefix_cache_min_tokens}; expected >= 0 "
                "snapshots (0 turns the prefix cache off) and >= 1 token"
            )
        if self.prefill_graph_tokens < 0:
            raise ValueError(
                f"prefill_graph_tokens is {self.prefill_graph_tokens}; it must be >= 0 (0 "
                "captures no prefill graphs)"
            )
        if self.max_queue_depth < 0:
            raise ValueError(
                f"max_queue_depth is {self.max_queue_depth}; it must be >= 0 (0 means unlimited)"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization is {self.gpu_memory_utilization}; it must be in (0, 1]"
            )
        for name, value in (
            ("num_kv_blocks", self.num_kv_blocks),
            ("num_state_slots", self.num_state_slots),
        ):
            if value is not None and value < 1:
                raise ValueError(f"{name} is {value}; it must be >= 1 or None (size from memory)")
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative is {self.speculative!r}; expected one of {SPECULATIVE_METHODS}"
            )
        if not 1 <= self.num_speculative_tokens <= 16 or self.speculative_max_seqs < 1:
            raise ValueError(
                f"num_speculative_tokens is {self.num_speculative_tokens} and "
                f"speculative_max_seqs {self.speculative_max_seqs}; expected 1..16 drafts and "
                ">= 1 request"
            )
        if any(t < 0 for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids is {self.eos_token_ids}; ids must be >= 0")

    @property
    def chunk_alignment(self) -> int:
        """Tokens a partial prompt chunk's end is a multiple of (1: cut anywhere).

        A step budget below PREFILL_CHUNK_ALIGNMENT cannot hold one whole GDN block, so prompts
        are cut anywhere then (and CUDA numerics may depend on where).
        """
        if not self.deterministic or self.max_num_batched_tokens < PREFILL_CHUNK_ALIGNMENT:
            return 1
        return PREFILL_CHUNK_ALIGNMENT

    @property
    def prefix_alignment(self) -> int:
        """Tokens a prefix-cache checkpoint is a multiple of: whole KV blocks, and a cut the
        deterministic mode allows, so a prompt resumed there gets the bits of one cut there."""
        return math.lcm(self.block_size, PREFILL_CHUNK_ALIGNMENT)

    @property
    def is_speculative(self) -> bool:
        return self.speculative != "off"

    @property
    def num_spec_state_rows(self) -> int:
        """State rows the runner keeps for verify steps' roll-back points (0: no speculation)."""
        if not self.is_speculative:
            return 0
        return self.speculative_max_seqs * self.num_speculative_tokens

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def prefill_graph_sizes(self) -> tuple[int, ...]:
        """Token counts of the prompt-chunk forwards to capture (empty: none)."""
        largest = min(self.prefill_graph_tokens, self.max_num_batched_tokens)
        if largest < 1:
            return ()
        sizes: list[int] = []
        size = _PREFILL_GRAPH_MIN_TOKENS
        while size < largest:
            sizes.append(size)
            size = size * 2 if size < _PREFILL_GRAPH_DOUBLING_UNTIL else size + _PREFILL_GRAPH_STEP
        return (*sizes, largest)

    def graph_batch_sizes(self, max_batch: int) -> tuple[int, ...]:
        """Decode batch sizes to capture, up to `max_batch` (always included)."""
        sizes = [b for b in _GRAPH_BUCKETS if b < max_batch]
        nxt = _GRAPH_BUCKETS[-1] + 32
        while nxt < max_batch:
            sizes.append(nxt)
            nxt += 32
        return (*sizes, max_batch)
