import pytest
from sparkinfer.scheduler.state_slots import StateSlots


def test_slots_reused_lowest_first():
    slots = StateSlots(3)
    a, b = slots.allocate(), slots.allocate()
    assert (a, b) == (0, 1) and slots.num_free_slots == 1
    slots.free(a)
    assert slots.allocate() == 0


def test_exhausted_pool_raises():
    slots = StateSlots(1)
    slots.allocate()
    with pytest.raises(RuntimeError, match="all 1 state slots are in use"):
        slots.allocate()


def test_double_free_is_an_invariant_error():
    slots = StateSlots(1)
    slots.free(slots.allocate())
    with pytest.raises(AssertionError):
        slots.free(0)
