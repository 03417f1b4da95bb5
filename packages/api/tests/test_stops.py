"""Stop strings across chunk boundaries: trimmed at the first match, nothing held at the end."""

from sparkinfer.api.stops import StopStringMatcher


def _run(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    m = StopStringMatcher(stops)
    out = "".join(m.feed(c) for c in chunks)
    return out + m.flush(), m.is_stopped


def test_stop_split_across_chunks_is_trimmed() -> None:
    assert _run(["STOP"], ["hello S", "TO", "P world"]) == ("hello ", True)


def test_first_match_wins_among_several_stops() -> None:
    assert _run(["bb", "a"], ["xxbb", "a"]) == ("xx", True)
    assert _run(["cd", "b"], ["abcd"]) == ("a", True)


def test_partial_prefix_is_released_when_it_turns_out_not_to_match() -> None:
    m = StopStringMatcher(["END"])
    assert m.feed("the EN") == "the "
    assert m.feed("D") == ""
    assert m.is_stopped and m.matched == "END"
    m2 = StopStringMatcher(["END"])
    assert m2.feed("the EN") == "the "
    assert m2.feed("TRY") == "ENTRY"
    assert m2.flush() == ""


def test_no_stops_passes_everything_through() -> None:
    assert _run([], ["a", "b"]) == ("ab", False)


def test_input_after_stop_is_ignored() -> None:
    m = StopStringMatcher(["x"])
    assert m.feed("ax") == "a"
    assert m.feed("more") == ""
    assert m.flush() == ""
