"""Programmatic dependent launch (Hopper and later): a kernel is scheduled while the kernel before
it in the stream still runs, so its launch and set-up overlap that kernel's tail.

Kernels opt in with a ``USE_PDL`` constexpr set from `dependent_launch(t)`, passed again as the
launch's ``launch_pdl``, and call `wait_for_prior_kernels(USE_PDL)` as their first statement. The
decode step's kernels do: at one stream its hundreds of launches are mostly short. Whether it is
on comes from the caller's `tuning.KernelTuning` (`use_dependent_launch`), not from process state.
"""

import functools

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import is_interpreting
from sparkinfer.kernels.tuning import current_tuning
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@functools.cache
def _supports_dependent_launch(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def dependent_launch(t: torch.Tensor) -> bool:
    """Whether a kernel on t's device launches as a programmatic dependent: CUDA, compute
    capability 9.0 or later, on in the current `KernelTuning`, not under the interpreter."""
    if not (t.is_cuda and current_tuning().use_dependent_launch) or is_interpreting():
        return False
    return _supports_dependent_launch(t.device.index or 0)


@triton.jit
def wait_for_prior_kernels(USE_PDL: tl.constexpr):
    """First statement of every kernel launched with ``launch_pdl``: wait until the kernel before
    it in the stream has finished and its writes are visible, then let the next kernel launch.

    Waiting first keeps every earlier kernel's writes ordered before this kernel's reads and
    writes; letting the next launch only after the wait keeps one kernel at a time waiting. The
    one exception is a read its caller vouches the kernel before cannot be writing (a state
    slot's rows, with `early_state`): every kernel before that one has finished by the time
    this one launches, so such a read may come first and overlap the wait.
    """
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_to_l2(p):
    """Ask for the 128-byte line at each pointer of p to be brought into L2 (CUDA only: inline
    PTX; nothing is read into registers). A dependent kernel may do it before
    `wait_for_prior_kernels` for data no kernel before it writes (weights), so its first loads
    find L2 warm while the kernel before ends."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;",
        "=r,l",
        [p],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
