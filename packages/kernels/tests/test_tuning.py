"""KernelTuning: the defaults outside any `kernel_tuning`, the innermost one inside, restored on
the way out, and private to the thread that entered it."""

import threading

import pytest
from sparkinfer.kernels.tuning import DEFAULT_TUNING, KernelTuning, current_tuning, kernel_tuning


def test_defaults_hold_outside_any_tuning():
    assert current_tuning() is DEFAULT_TUNING
    assert DEFAULT_TUNING.use_dependent_launch and DEFAULT_TUNING.shape_table is None


def test_innermost_tuning_wins_and_the_outer_one_comes_back():
    outer, inner = KernelTuning(use_dependent_launch=False), KernelTuning()
    with kernel_tuning(outer):
        with kernel_tuning(inner):
            assert current_tuning() is inner
        assert current_tuning() is outer
        with pytest.raises(RuntimeError), kernel_tuning(inner):
            raise RuntimeError("a failed forward")
        assert current_tuning() is outer
    assert current_tuning() is DEFAULT_TUNING


def test_a_tuning_is_private_to_its_thread():
    seen = []
    with kernel_tuning(KernelTuning(use_dependent_launch=False)):
        worker = threading.Thread(target=lambda: seen.append(current_tuning()))
        worker.start()
        worker.join()
    assert seen == [DEFAULT_TUNING]


def test_frozen():
    with pytest.raises(AttributeError):
        DEFAULT_TUNING.use_dependent_launch = False  # type: ignore[misc]
