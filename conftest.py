"""Repository-wide pytest setup: Triton runs in its interpreter when no CUDA device is present,
and transformers, the reference the model is checked against, runs its own plain-torch path."""

import os
import sys

import torch

# Where fla (flash-linear-attention) is installed, transformers' Qwen3.5 layers call its Triton
# kernels, which cannot take the CPU tensors the reference runs on. No test imports fla itself.
sys.modules.setdefault("fla", None)  # pyright: ignore[reportArgumentType]

if not torch.cuda.is_available():
    # Must be set before triton compiles anything, so kernels tests run on the CPU.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    import pytest

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
