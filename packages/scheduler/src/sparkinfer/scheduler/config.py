"""Engine settings: one frozen, validated dataclass (no torch here).

Each field's default and its rule live here only; the server's settings take both, and each
field's `help`, from these fields (`sparkinfer.api.settings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, get_args

from sparkinfer.kernels.tuning import KernelTuning
from sparkinfer.scheduler.errors import InvalidConfig

if TYPE_CHECKING:  # the table's module imports torch, which this module does not
    from sparkinfer.kernels.linear.shape_table import ShapeTable

# The output block of the GDN prefill kernels (two 64-token chunks share one stored state): with
# `deterministic`, prompt chunks are cut only at multiples of it, so where the budget cuts a
# prompt never changes the prompt's numerics (kernels.gated_delta_rule's README, contract).
PREFILL_CHUNK_ALIGNMENT = 128
# Decode batch sizes that get a CUDA graph: small sizes dense, larger ones every 16 then 32 rows.
_GRAPH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128)
# Prompt-chunk forwards that get a CUDA graph: token counts from the first doubling up to the
# second, then every third up to `prefill_graph_tokens`. Once the model's GEMMs are
# compute-bound, padding a step to the next bucket costs device time: steps of 64 keep the
# padding under 64 rows.
_PREFILL_GRAPH_MIN_TOKENS, _PREFILL_GRAPH_DOUBLING_UNTIL, _PREFILL_GRAPH_STEP = 16, 128, 64
SpeculativeMethod = Literal["auto", "off", "ngram", "mtp", "draft_model"]
SPECULATIVE_METHODS: tuple[SpeculativeMethod, ...] = get_args(SpeculativeMethod)
MAX_SPECULATIVE_TOKENS = 16
# The paged-attention kernels tile a KV block in powers of two, from 16 rows (CUDA; the CPU
# references take any power of two, which the scheduler's tests use for small pages).
CUDA_MIN_BLOCK_SIZE = 16
HELP = "help"  # the metadata key of each field's description
_BLOCK_SIZES = (
    f"a power of two (16, 32, 64, 128, ...; the CUDA kernels need >= {CUDA_MIN_BLOCK_SIZE}): "
    "the paged-attention kernels tile a block in powers of two"
)
_SIZES = ">= 1, or unset to size it from memory"
_METHODS = f"one of {', '.join(SPECULATIVE_METHODS)}"
_DRAFTS = f"1 to {MAX_SPECULATIVE_TOKENS} drafts"


def _help(text: str) -> dict[str, str]:
    """A field's metadata: the description the server's flags and README show."""
    return {HELP: text}


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine batches, caches and runs; each field's description is its `help`."""

    max_num_seqs: int = field(
        default=64,
        metadata=_help(
            "Most sequences in one engine step (also bounded by the state slots that fit)"
        ),
    )
    max_model_len: int = field(
        default=32768, metadata=_help("Context window: prompt plus generated tokens")
    )
    max_num_batched_tokens: int = field(
        default=2048,
        metadata=_help("Most tokens in one engine step: decode rows first, then prompt chunks"),
    )
    max_queue_depth: int = field(
        default=0,
        metadata=_help(
            "Most waiting requests before new ones are refused as overloaded (0: unlimited)"
        ),
    )
    block_size: int = field(
        default=64,
        metadata=_help(
            "Tokens per KV-cache block: a power of two, at least 16 on CUDA (the paged-attention "
            "kernels tile a block in powers of two)"
        ),
    )
    gpu_memory_utilization: float = field(
        default=0.90,
        metadata=_help(
            "Share of the GPU's memory the process may use for weights and caches, in (0, 1]"
        ),
    )
    num_kv_blocks: int | None = field(
        default=None,
        metadata=_help(
            "KV blocks to allocate; unset: sized from memory (cpu_cache_bytes on the CPU)"
        ),
    )
    num_state_slots: int | None = field(
        default=None,
        metadata=_help(
            "Recurrent-state rows to allocate; unset: sized from memory like num_kv_blocks"
        ),
    )
    cpu_cache_bytes: int = field(
        default=1 << 30, metadata=_help("Cache budget on the CPU when sizes are unset")
    )
    enforce_eager: bool = field(default=False, metadata=_help("Never capture CUDA graphs"))
    prefill_graph_tokens: int = field(
        default=512,
        metadata=_help(
            "Largest forward of an engine step's prompt chunks (tokens) replayed from a CUDA graph "
            "instead of launched eagerly: launching a short forward takes the host longer than the "
            "device takes to run it. 0: such steps launch eagerly"
        ),
    )
    overlap_steps: bool = field(
        default=True,
        metadata=_help(
            "Schedule the next engine step while the device runs this one: samples are read a step "
            "later and a request that stops has run one extra row; tokens are the same either way "
            "(a step with a logits processor is read at once)"
        ),
    )
    dependent_launch: bool = field(
        default=True,
        metadata=_help(
            "Launch each Triton kernel while the one before it finishes (programmatic dependent "
            "launch, Hopper and later), so launches overlap the kernels' tails; outputs are the "
            "same either way"
        ),
    )
    shape_table: ShapeTable | None = field(
        default=None,
        metadata=_help(
            "The linear layers' measured shape table (`kernels.linear.shape_table.ShapeTable`); "
            "unset: the committed one. For tools that compare tables in the engine"
        ),
    )
    deterministic: bool = field(
        default=False,
        metadata=_help(
            "Batch-invariant numerics: a request's output (greedy, or seeded) does not depend on "
            "what else is batched with it (fixed-tile GEMMs per phase, prompt chunks cut on whole "
            "GDN blocks). Costs speed on CUDA (docs/benchmarks.md); off, output is still identical "
            "across runs of the same batch"
        ),
    )
    eos_token_ids: tuple[int, ...] = field(
        default=(), metadata=_help("The model's end-of-sequence ids")
    )
    seed: int = field(
        default=0, metadata=_help("Seed of the sampler's shared generator (unseeded requests)")
    )
    prefix_cache_snapshots: int = field(
        default=8,
        metadata=_help(
            "Prompt prefixes kept for reuse, each with one snapshot of the model's recurrent "
            "state (taken from the KV cache's memory, like a state slot); a later prompt that "
            "starts with one prefills only the rest, and a new prompt pays one more prefill step "
            "to its checkpoint (docs/benchmarks.md). 0: no prefix cache"
        ),
    )
    prefix_cache_min_tokens: int = field(
        default=1024,
        metadata=_help(
            "Shortest uncached prompt part worth a prefix snapshot: such a prompt ends a prefill "
            "step at its last checkpoint (a multiple of 128 tokens and of block_size), where its "
            "prefix is kept"
        ),
    )
    vision_cache_bytes: int = field(
        default=1 << 28,
        metadata=_help(
            "Device memory for vision tower outputs kept by content hash, least recently used "
            "out, beside the KV cache's budget: an image or video sent again skips the tower. "
            "0: no cache"
        ),
    )
    vision_graph_patches: int = field(
        default=8192,
        metadata=_help(
            "Largest vision tower call (patches, summed over its images and videos) replayed "
            "from a CUDA graph captured for its grids at their first sight; bigger calls, whose "
            "GPU work dwarfs their launches, run eagerly. 0: the tower always runs eagerly"
        ),
    )
    speculative: SpeculativeMethod = field(
        default="auto",
        metadata=_help(
            "Speculative decoding's drafter: auto (the block drafter of --draft-model where one "
            "is given, else the checkpoint's MTP head where it has one, else plain decoding; the "
            "engine says which in one start-up line), draft_model (the --draft-model block "
            "drafter: a whole block of drafts from one forward of its own, as deep as its block), "
            "mtp (the checkpoint's MTP head, loaded from its mtp.* tensors), ngram (drafts copied "
            "from the request's own prompt and output: no weights, strong on code, JSON and "
            "edits) or off. "
            "Each request drafts as deep as its own acceptance pays for, and not at all where "
            "drafts do not pay (speculative_adaptive). Greedy and seeded output are unchanged "
            "(bit for bit with deterministic)"
        ),
    )
    num_speculative_tokens: int = field(
        default=3,
        metadata=_help(
            f"Most drafts a request verifies per engine step (1 to {MAX_SPECULATIVE_TOKENS}). "
            "Every running request may verify: the cache keeps each Gated-DeltaNet layer's inputs "
            "of every verify row (about 2 MB a row at 27B, num_verify_rows), not a state per draft"
        ),
    )
    speculative_draft_vocab: int = field(
        default=65_536,
        metadata=_help(
            "MTP drafts choose among the vocabulary's first N ids only (byte-pair vocabularies "
            "put their most common merges first), so each draft reads N rows of the lm_head, not "
            "all of them; a vocabulary of N ids or fewer drafts over all of it. Drafts are "
            "verified, so this trades acceptance for draft time, never output. The default's "
            "first 65,536 of Qwen3.5/3.6's 248,320 ids hold about 98 in 100 tokens of English and "
            "Python text, in a quarter of the lm_head's bytes. 0: the whole vocabulary"
        ),
    )
    speculative_adaptive: bool = field(
        default=True,
        metadata=_help(
            "Draft each request only as deep as its own acceptance pays for, stop drafting for a "
            "request whose drafts are rarely accepted, and in steps where the measured step times "
            "say verifying costs more than it brings; off: every request drafts "
            "num_speculative_tokens every step (tests, benchmarks)"
        ),
    )

    tensor_parallel_size: int = field(
        default=1,
        metadata=_help(
            "GPUs one model is split across, one process each started by the server (rank r on "
            "cuda:r; gloo ranks on the CPU): attention and Gated-DeltaNet heads, MLP columns and "
            "the vocabulary split, one all-reduce after each row-parallel projection "
            "(docs/scaling.md). Text only, without CUDA graphs or speculative decoding for now. "
            "1: one process, no collectives"
        ),
    )

    def __post_init__(self) -> None:
        block, drafts = self.block_size, self.num_speculative_tokens
        rules = (
            ("max_num_seqs", self.max_num_seqs >= 1, ">= 1"),
            ("max_model_len", self.max_model_len >= 1, ">= 1"),
            ("max_num_batched_tokens", self.max_num_batched_tokens >= 1, ">= 1"),
            ("max_queue_depth", self.max_queue_depth >= 0, ">= 0 (0: unlimited)"),
            ("block_size", block >= 1 and block & (block - 1) == 0, _BLOCK_SIZES),
            ("gpu_memory_utilization", 0.0 < self.gpu_memory_utilization <= 1.0, "in (0, 1]"),
            ("num_kv_blocks", _is_size(self.num_kv_blocks), _SIZES),
            ("num_state_slots", _is_size(self.num_state_slots), _SIZES),
            ("cpu_cache_bytes", self.cpu_cache_bytes >= 1, ">= 1"),
            ("prefill_graph_tokens", self.prefill_graph_tokens >= 0, ">= 0 (0: no graphs)"),
            ("prefix_cache_snapshots", self.prefix_cache_snapshots >= 0, ">= 0 (0: no cache)"),
            ("prefix_cache_min_tokens", self.prefix_cache_min_tokens >= 1, ">= 1"),
            ("vision_cache_bytes", self.vision_cache_bytes >= 0, ">= 0 (0: no cache)"),
            ("vision_graph_patches", self.vision_graph_patches >= 0, ">= 0 (0: no graphs)"),
            ("speculative", self.speculative in SPECULATIVE_METHODS, _METHODS),
            ("num_speculative_tokens", 1 <= drafts <= MAX_SPECULATIVE_TOKENS, _DRAFTS),
            ("speculative_draft_vocab", self.speculative_draft_vocab >= 0, ">= 0 (0: all)"),
            ("tensor_parallel_size", self.tensor_parallel_size >= 1, ">= 1"),
            ("eos_token_ids", all(t >= 0 for t in self.eos_token_ids), "ids >= 0"),
        )
        for name, is_valid, allowed in rules:
            _check(self, name, is_valid, allowed)

    def check_cuda(self) -> None:
        """Raise InvalidConfig where the CUDA kernels need more than the CPU path does."""
        _check(
            self,
            "block_size",
            self.block_size >= CUDA_MIN_BLOCK_SIZE,
            f"a power of two >= {CUDA_MIN_BLOCK_SIZE} on CUDA (the paged-attention kernels' "
            "smallest tile)",
        )

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
    def kernel_tuning(self) -> KernelTuning:
        """The launch choices this config makes for the kernels (the runner passes them on)."""
        return KernelTuning(
            use_dependent_launch=self.dependent_launch, shape_table=self.shape_table
        )

    @property
    def is_speculative(self) -> bool:
        """Whether a drafter runs: "auto" counts once resolved (`resolve_speculative`)."""
        return self.speculative in ("ngram", "mtp", "draft_model")

    def resolve_speculative(
        self, *, has_mtp_head: bool, draft_model_depth: int = 0
    ) -> SchedulerConfig:
        """This config with "auto" made concrete for a model: the block drafter where one is
        given (draft_model_depth > 0: the drafts its block proposes), else its MTP head where it
        has one, else plain decoding. A block drafter verifies its whole block: its depth
        replaces num_speculative_tokens."""
        method = self.speculative
        if method == "auto":
            method = "draft_model" if draft_model_depth else "mtp" if has_mtp_head else "off"
        if method == "draft_model" and draft_model_depth:
            return replace(self, speculative=method, num_speculative_tokens=draft_model_depth)
        return self if method == self.speculative else replace(self, speculative=method)

    def resolve_state_slots(self, num_slots: int) -> SchedulerConfig:
        """This config with the state slots the cache plan allocated made concrete."""
        if self.num_state_slots == num_slots:
            return self
        return replace(self, num_state_slots=num_slots)

    @property
    def max_seqs_per_step(self) -> int:
        """Most sequences one engine step holds: max_num_seqs, bounded by the state slots.

        Each running sequence owns one recurrent-state slot, so when memory (or num_state_slots)
        gives fewer slots than max_num_seqs asks for, the slots are the limit. Until the slots
        are known (`resolve_state_slots`), this is max_num_seqs.
        """
        if self.num_state_slots is None:
            return self.max_num_seqs
        return min(self.max_num_seqs, self.num_state_slots)

    @property
    def num_verify_rows(self) -> int:
        """Most rows of a verify forward (0: no speculation): every sequence of a step with
        num_speculative_tokens drafts, within the step's token budget (drafts count in it). The
        caches keep each GDN layer's inputs of that many rows until the accepted ones commit
        (`VerifyStash`); no state row is kept per draft, so every running request may verify."""
        if not self.is_speculative:
            return 0
        return min(
            self.max_num_seqs * (self.num_speculative_tokens + 1), self.max_num_batched_tokens
        )

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


def _is_size(value: int | None) -> bool:
    return value is None or value >= 1


def _check(config: SchedulerConfig, name: str, is_valid: bool, allowed: str) -> None:
    if not is_valid:
        value = getattr(config, name)
        raise InvalidConfig(name, f"{name} is {value!r}; it must be {allowed}")
