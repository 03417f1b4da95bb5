"""Repository-wide pytest setup: Triton runs in its interpreter when no CUDA device is present,
and transformers, the reference the model is checked against, runs its own plain-torch path.
Without CUDA the gpu tests are skipped; with it, the CPU-only ones (the kernels' interpreter tests,
unless marked any_device, and those marked cpu_only)."""

import os
import sys

import torch

# Where fla (flash-linear-attention) is installed, transformers' Qwen3.5 layers call its Triton
# kernels, which cannot take the CPU tensors the reference runs on. No test imports fla itself.
sys.modules.setdefault("fla", None)  # pyright: ignore[reportArgumentType]

if not torch.cuda.is_available():
    # Must be set before triton compiles anything, so kernels tests run on the CPU.
    os.environ.setdefault("TRITON_INTERPRET", "1")


KERNEL_TESTS = os.path.join("packages", "kernels", "tests")


def pytest_collection_modifyitems(config, items):
    import pytest

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
        return
    # With a CUDA device Triton compiles for it, so the kernels' CPU tests (written for its
    # interpreter) cannot run, nor can tests of CPU stand-ins for CUDA streams and graphs.
    skip = pytest.mark.skip(
        reason="a CPU test (Triton's interpreter, or CPU stand-ins for CUDA): it runs where no "
        "CUDA device is present, as in CI; the gpu tests cover the same code here"
    )
    for item in items:
        in_kernel_tests = KERNEL_TESTS in str(item.path)
        is_interpreted = in_kernel_tests and not {"gpu", "any_device"} & set(item.keywords)
        if "cpu_only" in item.keywords or is_interpreted:
            item.add_marker(skip)
