"""The kernels' tuning: the launch choices a caller makes for the kernels it runs, as one frozen
object instead of process-wide switches.

`KernelTuning` holds whether kernels launch as programmatic dependents (`dependent_launch`),
which measured shape table the linear dispatcher reads (`linear.shape_table`) and which FP8
kernel each row count takes (`fp8_linear.routes`). A caller runs its
launches inside `kernel_tuning(tuning)`: the engine's runner does so for every forward, graph
capture and device step, from its config, so two engines in one process (a benchmark comparing
tables) each run their own. Outside any `kernel_tuning` the defaults hold: dependent launch on,
the committed tables. The launchers read it with `current_tuning()` rather than taking it as an
argument, so each keeps the signature of its reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the table's module imports the launchers, whose launches read this one
    from sparkinfer.kernels.fp8_linear.routes import Fp8Route
    from sparkinfer.kernels.linear.shape_table import ShapeTable


@dataclass(frozen=True)
class KernelTuning:
    """use_dependent_launch: launch the kernels that support it as programmatic dependents
    (Hopper and later; outputs are the same either way). shape_table: the linear dispatcher's
    measured table; None: the committed `shape_table.json`. fp8_routes: the FP8 kernel per row
    count; None: the committed `fp8_linear.routes.FP8_ROUTES`."""

    use_dependent_launch: bool = True
    shape_table: ShapeTable | None = None
    fp8_routes: tuple[Fp8Route, ...] | None = None


DEFAULT_TUNING = KernelTuning()
_TUNING: ContextVar[KernelTuning] = ContextVar("sparkinfer_kernel_tuning", default=DEFAULT_TUNING)


@contextlib.contextmanager
def kernel_tuning(tuning: KernelTuning) -> Iterator[KernelTuning]:
    """Launches inside (on this thread or task) use `tuning`; a CUDA graph captured inside keeps
    the kernels it captured whatever runs its replays."""
    token = _TUNING.set(tuning)
    try:
        yield tuning
    finally:
        _TUNING.reset(token)


def current_tuning() -> KernelTuning:
    """The tuning of the innermost `kernel_tuning`, or DEFAULT_TUNING outside one."""
    return _TUNING.get()
