"""Shared launch helpers: input checks that raise clear errors before a Triton launch, and the
per-step cache of index tables built from ``cu_seqlens``.

Each check names the argument, what it got and what it expected. Launchers call them first, then
allocate outputs and launch; inputs are never checked with ``assert``.
"""

import functools
from collections.abc import Callable, Iterable

import torch
import triton
import triton.language as tl

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
TMA_ALIGN_BYTES = 16  # tensor-descriptor base addresses and strides


def is_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    knobs = getattr(triton, "knobs", None)
    return bool(knobs is not None and knobs.runtime.interpret)


@functools.cache
def _compute_capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


INTERPRETER_NUM_SMS = 8  # a nominal small GPU, so CPU tests run the grid-size-aware plans


@functools.cache
def _multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_multiprocessors(device: torch.device) -> int:
    """SMs of a CUDA device (cached: fixed data); INTERPRETER_NUM_SMS for the CPU interpreter."""
    if device.type != "cuda":
        return INTERPRETER_NUM_SMS
    return _multiprocessor_count(
        device.index if device.index is not None else torch.cuda.current_device()
    )


def tma_device_error(t: torch.Tensor) -> str | None:
    """Why t's device cannot run tensor descriptors (TMA: sm_90 or newer, or the interpreter),
    or None."""
    if t.is_cuda:
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        major, minor = _compute_capability(index)
        return None if major >= 9 else f"TMA needs sm_90 or newer; the GPU is sm_{major}{minor}"
    return None if is_interpreting() else f"TMA needs a CUDA device; the input is on {t.device}"


def tma_aligned(t: torch.Tensor, *strides: int) -> bool:
    """t's base address and the given strides (in elements) are multiples of 16 bytes."""
    size = t.element_size()
    return t.data_ptr() % TMA_ALIGN_BYTES == 0 and all(
        x * size % TMA_ALIGN_BYTES == 0 for x in strides
    )


def check_device(op: str, tensors: dict[str, torch.Tensor]) -> torch.device:
    """All tensors on one device, CUDA unless Triton interprets on the CPU; returns that device."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, device = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != device:
            raise ValueError(
                f"{op}: {name} is on {dev} but {first_name} is on {device}; "
                "move all inputs to the same device"
            )
    if device.type != "cuda" and not is_interpreting():
        raise ValueError(
            f"{op}: inputs are on {device}; Triton kernels need CUDA tensors "
            "(or TRITON_INTERPRET=1 for CPU tests)"
        )
    return device


def check_dtype(op: str, name: str, t: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    """Raise TypeError unless t.dtype is one of ``allowed``."""
    allowed = tuple(allowed)
    if t.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected one of {names}")


def check_shape(op: str, name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    """Raise ValueError unless t.shape == expected."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} has shape {list(t.shape)}; expected {list(expected)}")


def check_ndim(op: str, name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise ValueError unless t has ``ndim`` dims; ``layout`` names them, e.g. "[T, H, K]"."""
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} has shape {list(t.shape)}; expected {layout}")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    """Raise ValueError unless t is contiguous (row-major, dense)."""
    if not t.is_contiguous():
        raise ValueError(
            f"{op}: {name} has strides {t.stride()} for shape {list(t.shape)}; "
            "expected a contiguous tensor: call .contiguous() first"
        )


def check_last_dim_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    """Raise ValueError unless the last dim has stride 1 (other dims may be strided views)."""
    if t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has strides {t.stride()}; expected stride 1 in the last dim: "
            "call .contiguous() first"
        )


# The least tl.dot dimension a kernel's tiles use: Triton compiles no dot with K under 16 for
# 16-bit operands on NVIDIA (nor for fp32 ones in some releases); its interpreter checks nothing.
MIN_DOT_TILE = 16


def dot_tile(n: int) -> int:
    """A tile along a tl.dot dimension covering n: its next power of two, at least MIN_DOT_TILE
    (a head dim of 8 or a GQA group of 4 still compiles; the kernel masks the padding)."""
    return max(MIN_DOT_TILE, triton.next_power_of_2(n))


def dot_dtype(t: torch.Tensor) -> tl.dtype:
    """Operand dtype for tl.dot on t's device: its own dtype on a GPU, fp32 on the CPU.

    The Triton interpreter (CPU tests) multiplies bf16 operands of tl.dot as raw integers, so
    kernels cast operands to this dtype first; on a GPU the cast is a no-op.
    """
    if t.is_cuda:
        return _TL_DTYPES[t.dtype]
    return tl.float32


def dot_precision(t: torch.Tensor) -> str:
    """`input_precision` for tl.dot over t's dtype: "ieee" for fp32 operands (exact fp32
    products, as torch's default matmul; Triton's default rounds them to tf32 on tensor cores,
    an error near 1e-3 a product), "tf32" (Triton's default, which 16-bit operands ignore)
    otherwise, so a bf16 kernel compiles as without it. The CPU interpreter ignores it."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def check_varlen_batch(
    op: str,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor | None,
) -> None:
    """cu_seqlens [B + 1] int32, state_slots [B] int64, has_initial_state [B] bool, contiguous."""
    check_dtype(op, "cu_seqlens", cu_seqlens, (torch.int32, torch.int64))
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_ndim(op, "cu_seqlens", cu_seqlens, 1, "[B + 1]")
    num_seqs = cu_seqlens.shape[0] - 1
    if num_seqs < 1:
        raise ValueError(
            f"{op}: cu_seqlens has shape {list(cu_seqlens.shape)}; expected [B + 1] with B >= 1"
        )
    check_shape(op, "state_slots", state_slots, (num_seqs,))
    check_contiguous(op, "cu_seqlens", cu_seqlens)
    check_contiguous(op, "state_slots", state_slots)
    if has_initial_state is not None:
        check_dtype(op, "has_initial_state", has_initial_state, (torch.bool,))
        check_shape(op, "has_initial_state", has_initial_state, (num_seqs,))
        check_contiguous(op, "has_initial_state", has_initial_state)


IndexCache = dict[str, tuple[torch.Tensor, ...]]


def cached_index_tables(
    index_cache: IndexCache | None,
    key: str,
    cu_seqlens: torch.Tensor,
    num_rows: int,
    build: Callable[[], tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, ...]:
    """`build()`'s tables (the first has num_rows rows), from ``index_cache`` when an earlier call
    of the step over this same ``cu_seqlens`` tensor stored them under `key`, else built and
    stored: the layers of one forward share them instead of rebuilding them each."""
    entry = index_cache.get(key) if index_cache is not None else None
    if entry is not None and entry[0] is cu_seqlens and entry[1].shape[0] == num_rows:
        return entry[1:]
    tables = build()
    if index_cache is not None:
        index_cache[key] = (cu_seqlens, *tables)
    return tables
