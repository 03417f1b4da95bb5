"""Kernel test helpers: NaN-filled output allocation, per-dtype tolerances, launch recording.

Every floating tensor a launcher allocates with ``torch.empty``/``torch.empty_like`` during a
kernels test starts as NaN, so an element the kernel never writes fails the comparison.
"""

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch

# (atol, rtol) for comparing a fast op with its fp32 reference, by output dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-4, 2e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

_empty = torch.empty
_empty_like = torch.empty_like


def _nan_filled(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


def _empty_nan(*args, **kwargs) -> torch.Tensor:
    return _nan_filled(_empty(*args, **kwargs))


def _empty_like_nan(*args, **kwargs) -> torch.Tensor:
    return _nan_filled(_empty_like(*args, **kwargs))


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make torch.empty / torch.empty_like return NaN-filled floating tensors for the test."""
    monkeypatch.setattr(torch, "empty", _empty_nan)
    monkeypatch.setattr(torch, "empty_like", _empty_like_nan)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for outputs of ``dtype``."""
    return TOLERANCES[dtype]


@pytest.fixture
def assert_close() -> Callable[..., None]:
    """assert_close(actual, expected, dtype=None): compare with the tolerance of ``dtype``.

    ``dtype`` defaults to actual.dtype; both tensors are compared in fp32 and NaN never matches.
    """

    def check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None):
        atol, rtol = TOLERANCES[dtype or actual.dtype]
        torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)

    return check


@dataclass(frozen=True)
class Launch:
    """One launch of a Triton kernel: its grid, positional and keyword arguments."""

    grid: tuple[int, ...]
    args: tuple[object, ...]
    kwargs: dict[str, object]

    @property
    def ints(self) -> tuple[int, ...]:
        """The integer positional arguments (sizes and strides), in order."""
        return tuple(a for a in self.args if isinstance(a, int) and not isinstance(a, bool))


class LaunchRecorder:
    """Stands in for a Triton kernel: records each launch, then runs the kernel."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launches: list[Launch] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(Launch(tuple(grid), args, dict(kwargs)))
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.fixture
def record_launches(monkeypatch: pytest.MonkeyPatch) -> Callable[[ModuleType, str], LaunchRecorder]:
    """record_launches(module, name): replace module.name, a Triton kernel, by a LaunchRecorder.

    Under the interpreter tl.dot is numpy's matmul, whose rounding follows the BLAS kernel the CPU
    picks and the operand shapes, so bit-exact comparisons there test numpy. What the launcher
    controls (tiles, K slices, the order of the reduction) is read from the recorded launches.
    """

    def record(module: ModuleType, name: str) -> LaunchRecorder:
        recorder = LaunchRecorder(getattr(module, name))
        monkeypatch.setattr(module, name, recorder)
        return recorder

    return record
