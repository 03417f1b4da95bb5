"""Idle gaps between kernels."""

from sparkinfer.lab.idle_gaps import Gap, Idle, idle


def test_idle_counts_gaps_between_kernels_once_and_names_their_neighbours():
    events = [("b", 10.0, 5.0), ("a", 0.0, 4.0), ("c", 12.0, 10.0), ("d", 40.0, 2.0)]
    result = idle(events, top=1)
    assert result.span_ms == 42.0 / 1e3
    assert abs(result.idle_ms - (6.0 + 18.0) / 1e3) < 1e-12  # c overlaps b: no gap between them
    assert result.gaps == (Gap(18.0, "c", "d"),)
    assert idle([], top=3) == Idle(0.0, 0.0, ())
