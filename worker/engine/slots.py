"""Where rows sit in the batch: ordinary rows first, beam rows after them.

Slot i of the KV cache, row i of the decoding batch and `Slots.rows[i]` are the same row, and the
rows of a decode step are always a prefix of the batch (a contiguous cache view, no gather). Keeping
ordinary rows ahead of beam rows lets a step run the ordinary rows alone (see beam_budget.py). The
slot past the last row is where the next prompt is prefilled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.decoding.batch import DecodingBatch, RowSpec
from worker.decoding.rows import RowState
from worker.engine.kv_cache import KVCache
from worker.engine.sequence import RequestState, Sequence


@dataclass
class Parked:
    """A preempted request's row set aside whole: its sequence, its decoding state (history, seeded
    generator, n-grams, grammar) and its cache positions, so it resumes exactly where it stopped."""
    sequence: Sequence
    row: RowState
    kv: torch.Tensor  # KVCache.copy_out of its slot


class Slots:
    """The running rows, their decoding batch and their KV cache slots, kept in the same order."""

    def __init__(self, cache: KVCache, vocab_size: int):
        self.cache, self.vocab_size = cache, vocab_size
        self.rows: list[Sequence] = []
        self.batch = DecodingBatch(vocab_size, "cpu")

    @property
    def free(self) -> int:
        """The slot the next prompt is prefilled into."""
        return len(self.rows)

    def ordinary(self) -> int:
        """How many rows lead the batch before the first beam row."""
        return next((i for i, row in enumerate(self.rows) if row.request.beam is not None), len(self.rows))

    def join(self, sequences: list[Sequence], specs: list[RowSpec], prefilled: int) -> None:
        """A request's rows join behind the others: its prompt, prefilled in the free slot, is copied to each
        extra candidate's slot, and an ordinary request's rows move ahead of the beam rows."""
        ordinary, first = self.ordinary(), self.free
        for extra in range(1, len(sequences)):
            self.cache.move(first, first + extra, prefilled)
        for sequence, spec in zip(sequences, specs):
            self.rows.append(sequence)
            self.batch.add(spec)
        if sequences[0].request.beam is None:
            self._swap(joining_swaps(ordinary, first, len(self.rows)))

    def leave(self, prefilling: RequestState | None) -> list[Sequence]:
        """Finished rows leave and are returned; later rows fill their slots so 0..B-1 stay dense, ordinary rows
        first, and the prompt being prefilled past them (`prefilling`) moves down along with them."""
        gone = [i for i, row in enumerate(self.rows) if row.finish]
        return self._remove(gone, prefilling)

    def park(self, rows: list[Sequence]) -> None:
        """Rows leave the batch unfinished (preempted; no prompt is being prefilled): each row and its cache
        positions are kept on its request's `parked`, in slot order, until `resume`."""
        slots = sorted(next(i for i, held in enumerate(self.rows) if held is row) for row in rows)
        for slot in slots:
            row = self.rows[slot]
            row.request.parked.append(Parked(row, self.batch.rows[slot], self.cache.copy_out(slot, 0, row.length)))
        self._remove(slots, None)

    def set_aside(self, state: RequestState) -> None:
        """The prompt partly prefilled in the free slot leaves it: its positions are kept on `state.set_aside`
        until `take_back`."""
        state.set_aside = self.cache.copy_out(self.free, 0, state.prefilled) if state.prefilled else None

    def take_back(self, state: RequestState) -> None:
        """A prompt set aside is back in the free slot, as far as it was prefilled."""
        if state.set_aside is not None:
            self.cache.copy_in(self.free, state.set_aside)
            state.set_aside = None

    def resume(self, state: RequestState) -> None:
        """A request's parked rows join behind the others, from the free slot on, as they were when parked (a
        beam search's in the order it parked them; an ordinary request's move ahead of the beam rows)."""
        ordinary, first = self.ordinary(), self.free
        for offset, parked in enumerate(state.parked):
            self.cache.copy_in(first + offset, parked.kv)
            self.rows.append(parked.sequence)
            self.batch.add_row(parked.row)
        if state.beam is None:
            self._swap(joining_swaps(ordinary, first, len(self.rows)))
        state.parked = []

    def _remove(self, gone: list[int], prefilling: RequestState | None) -> list[Sequence]:
        if not gone:
            return []
        gone_set = set(gone)
        survivors = [i for i in range(len(self.rows)) if i not in gone_set]
        order = compacted_order(survivors, [self.rows[i].request.beam is None for i in survivors])
        for target, source in enumerate(order):
            if source != target:
                self.cache.move(source, target, self.rows[source].length)
        left, old_free = [self.rows[i] for i in gone], self.free
        self.rows = [self.rows[i] for i in order]
        self.batch.reorder(order)
        if prefilling is not None and prefilling.prefilled and old_free != self.free:
            self.cache.move(old_free, self.free, prefilling.prefilled)
        return left

    def clear(self, state: RequestState) -> None:
        """Zero the slots of a request that failed (what it left there may be NaN)."""
        for slot, row in enumerate(self.rows):
            if row.request is state:
                self.cache.clear(slot)

    def reset(self) -> None:
        """Every row gone at once (the whole batch failed), the prefill slot cleared too."""
        for slot in range(len(self.rows) + 1):
            self.cache.clear(slot)
        self.rows = []
        self.batch = DecodingBatch(self.vocab_size, "cpu")

    def _swap(self, swaps: list[tuple[int, int]]) -> None:
        if not swaps:
            return
        order = list(range(len(self.rows)))
        for first, second in swaps:
            length = max(self.rows[first].length, self.rows[second].length)
            self.cache.swap(first, second, length)
            order[first], order[second] = second, first
        self.rows = [self.rows[i] for i in order]
        self.batch.reorder(order)


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
