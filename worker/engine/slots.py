"""Where rows sit in the batch: ordinary rows first, beam rows after them.

Slot i of the KV cache, row i of the decoding batch and `Engine.rows[i]` are the same row, and the
rows of a decode step are always a prefix of the batch (a contiguous cache view, no gather). Keeping
ordinary rows ahead of beam rows lets a step run the ordinary rows alone (see beam_budget.py).
"""

from __future__ import annotations


def compacted_order(survivors: list[int], ordinary: list[bool]) -> list[int]:
    """New slot -> old slot after rows leave: ordinary survivors first, then beam survivors.

    `survivors` are the old slots that stay, ascending, with the partition already in place; a row
    already inside its group's new range keeps its slot, the others fill the gaps in slot order.
    Copying old slot order[t] into slot t for ascending t never overwrites a row not yet copied: a
    gap in the ordinary range held an ordinary row that left, and a gap in the beam range held a row
    that left or an ordinary row copied before it."""
    groups = ([s for s, o in zip(survivors, ordinary) if o], [s for s, o in zip(survivors, ordinary) if not o])
    order: list[int] = []
    for members in groups:
        low, high = len(order), len(order) + len(members)
        staying = {s for s in members if low <= s < high}
        incoming = iter(s for s in members if not low <= s < high)
        order += [t if t in staying else next(incoming) for t in range(low, high)]
    return order


def joining_swaps(ordinary: int, first_new: int, end: int) -> list[tuple[int, int]]:
    """Slot pairs to swap when an ordinary request's rows (slots first_new..end-1) join behind beam
    rows (slots ordinary..first_new-1): the first beam rows trade places with the last new rows."""
    moved = min(end - first_new, first_new - ordinary)
    return [(ordinary + j, end - moved + j) for j in range(moved)]
