"""Kernel test helpers: NaN-filled output allocation, per-dtype tolerances, bit comparisons,
launch recording.

Every floating tensor a launcher allocates with ``torch.empty``/``torch.empty_like`` during a
kernels test starts as NaN, so an element the kernel never writes fails the comparison.

Bits are compared only through ``assert_same_bits`` and ``assert_same_bits_across_shapes``
(tests/test_bit_comparisons.py rejects a raw ``torch.equal`` or zero-tolerance
``assert_close`` here): under the interpreter tl.dot is numpy's matmul and tl.sum numpy's sum,
whose rounding follows the operand shapes and the BLAS kernel the CPU picks, so two
computations of different shapes (batch compositions, tiles, fused against unfused kernels)
may differ in the last bit on one machine and not on another. Those comparisons belong to gpu
tests; under the interpreter they compare within tolerance.
"""

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
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


def _same_bits(actual: torch.Tensor, expected: torch.Tensor, *, equal_nan: bool = False) -> None:
    """Identical values, shapes and dtypes; NaN matches NaN only with equal_nan (so an output a
    kernel never wrote, NaN-filled, fails a comparison of two runs)."""
    assert actual.shape == expected.shape, f"shapes {actual.shape} and {expected.shape} differ"
    assert actual.dtype == expected.dtype, f"dtypes {actual.dtype} and {expected.dtype} differ"
    if equal_nan and actual.is_floating_point():
        assert torch.equal(actual.isnan(), expected.isnan()), "NaN in different places"
        actual, expected = actual.nan_to_num(0.0), expected.nan_to_num(0.0)
    if not torch.equal(actual, expected):
        differ = int((actual != expected).sum())
        raise AssertionError(f"{differ} of {actual.numel()} elements differ in their bits")


@pytest.fixture
def assert_same_bits() -> Callable[..., None]:
    """assert_same_bits(actual, expected, equal_nan=False): identical bits, on any device.

    Only for computations of the same shapes: one launch repeated, flags that change where or
    when data is read but not the arithmetic's shapes (TMA against pointer loads, an early state
    read, the grid's order), data copied without arithmetic, integer results."""
    return _same_bits


@pytest.fixture
def assert_same_bits_across_shapes() -> Callable[..., None]:
    """assert_same_bits_across_shapes(actual, expected): identical bits between computations of
    different shapes (a row alone and in a batch, other tiles, a fused kernel against the
    unfused ones); on a CUDA device only: under the interpreter it fails, as its result would
    test numpy's BLAS (mark the test gpu, and compare within tolerance on the CPU)."""

    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        if not (actual.is_cuda and expected.is_cuda):
            pytest.fail(
                "bit equality across shapes needs CUDA tensors: under the interpreter numpy's "
                "BLAS rounds each shape its own way; mark the test gpu and compare CPU results "
                "with assert_close"
            )
        _same_bits(actual, expected)

    return check


@pytest.fixture
def assert_same_bits_on_gpu(
    assert_close: Callable[..., None], assert_same_bits_across_shapes: Callable[..., None]
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """assert_same_bits_on_gpu(actual, expected), for computations of different shapes in a test
    that runs on both devices (any_device): the same bits on CUDA, the dtype's tolerance under
    the interpreter."""

    def check(actual: torch.Tensor, expected: torch.Tensor) -> None:
        if actual.is_cuda:
            assert_same_bits_across_shapes(actual, expected)
        else:
            assert_close(actual, expected)

    return check


def _exact_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """tl.dot with float64 products and sums rounded once to the accumulator's dtype: each
    output element depends on its row and column alone, whatever the operand shapes."""
    from triton.runtime.interpreter import TensorHandle

    product = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64))
    return TensorHandle(product.astype(d.data.dtype) + d.data, d.dtype.scalar)


@pytest.fixture
def exact_dots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter, make tl.dot independent of the operand shapes (_exact_dot), so two
    kernels that give each row the same arithmetic in tiles of other shapes give the same bits:
    a claim about the kernels' arithmetic that numpy's BLAS would otherwise blur."""
    from triton.runtime.interpreter import InterpreterBuilder

    monkeypatch.setattr(InterpreterBuilder, "create_dot", _exact_dot)


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
