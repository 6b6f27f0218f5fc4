"""Slot layout: ordinary rows stay ahead of beam rows through departures and arrivals, with copies
that never overwrite a row before it has been copied."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.engine.slots import compacted_order, joining_swaps


@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40).map(
    lambda rows: sorted(rows, key=lambda r: not r[0])))  # (ordinary, stays), ordinary rows first
def test_compaction_keeps_the_partition_and_copies_safely(rows):
    slots = list(range(len(rows)))  # slot -> the row it holds
    survivors = [i for i, (_, stays) in enumerate(rows) if stays]
    order = compacted_order(survivors, [rows[i][0] for i in survivors])
    assert sorted(order) == survivors
    kinds = [rows[s][0] for s in order]
    assert kinds == sorted(kinds, reverse=True)  # ordinary first
    for target, source in enumerate(order):  # the engine copies in this order
        if source != target:
            assert target not in survivors or target in order[:target], "would overwrite an uncopied row"
            slots[target] = slots[source]
    assert slots[: len(order)] == order
    # at most one ordinary and one beam row move per row that left
    assert sum(source != target for target, source in enumerate(order)) <= 2 * (len(rows) - len(survivors))


@given(st.integers(0, 10), st.integers(0, 10), st.integers(1, 10))
def test_joining_rows_swap_into_the_ordinary_range(ordinary, beams, new):
    rows = ["o"] * ordinary + ["b"] * beams + ["n"] * new
    for first, second in joining_swaps(ordinary, ordinary + beams, len(rows)):
        rows[first], rows[second] = rows[second], rows[first]
    assert rows == ["o"] * ordinary + ["n"] * new + ["b"] * beams
