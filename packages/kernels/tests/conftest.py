"""Kernel test helpers: NaN-filled output allocation and per-dtype tolerances.

Every floating tensor a launcher allocates with ``torch.empty``/``torch.empty_like`` during a
kernels test starts as NaN, so an element the kernel never writes fails the comparison.
"""

from collections.abc import Callable

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
