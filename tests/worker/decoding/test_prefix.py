"""A step over some rows of a batch equals those rows run on their own: the first rows (the others
sit the step out), or consecutive row groups that each choose their tokens in their own thread."""

from __future__ import annotations

import torch

from tests.worker.decoding.helpers import spec
from worker.decoding import DecodingBatch
from worker.decoding.sampling import Choice

V = 40
SETTINGS = [dict(temperature=0.0, repetition_penalty=1.3),
            dict(temperature=0.8, top_k=10, seed=5, presence_penalty=0.5, frequency_penalty=0.3),
            dict(temperature=0.0, no_repeat_ngram_size=2, encoder_repetition_penalty=1.2),
            dict(temperature=0.9, top_p=0.8, seed=9, repetition_penalty=1.1)]


def _logits(row: int, step: int) -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(100 * row + step)) * 3


def _fill(batch: DecodingBatch) -> None:
    for i, settings in enumerate(SETTINGS):
        settings = dict(settings)
        batch.add(spec([i + 1, 7, 3], seed=settings.pop("seed", 0), **settings))


def _step(batch: DecodingBatch, rows: list[int], step: int) -> list[int]:
    choice = batch.choose(batch.process(torch.stack([_logits(r, step) for r in rows])))
    batch.append(choice.tokens)
    return choice.token_ids


def test_prefix_steps_equal_the_rows_alone_and_keep_their_state_in_the_batch():
    full, alone = DecodingBatch(V), DecodingBatch(V)
    _fill(full)
    _fill(alone)
    alone.reorder([0, 1])  # the prefix rows, as a batch of their own
    stepped, expected = [], []
    for step in range(12):
        if step % 3 == 2:  # now and then every row steps, the last two only then
            stepped.append(_step(full, [0, 1, 2, 3], step)[:2])
        else:
            stepped.append(_step(full.prefix(2), [0, 1], step))
        expected.append(_step(alone, [0, 1], step))
    assert stepped == expected
    # the penalties' state of the prefix rows lives in the batch: it saw every prefix step
    assert full.history(0) == alone.history(0) and full.history(1) == alone.history(1)
    assert torch.equal(full.tensors.counts[:2], alone.tensors.counts)
    assert torch.equal(full.tensors.seen[:2], alone.tensors.seen)
    assert len(full.history(3)) == 3 + 4  # prompt + the four full steps


def test_row_groups_processed_apart_equal_the_whole_batch_and_share_its_state():
    whole, grouped = DecodingBatch(V), DecodingBatch(V)
    _fill(whole)
    _fill(grouped)
    for step in range(8):
        logits = torch.stack([_logits(r, step) for r in range(4)])
        expected = whole.choose(whole.process(logits))
        whole.append(expected.tokens)
        parts = []
        for first, end in ((0, 1), (1, 4)):  # as the engine's row groups: a slice each, then one append
            group = grouped.slice(first, end)
            parts.append(group.choose(group.process(logits[first:end])))
        choice = Choice.concat(parts)
        grouped.append(choice.tokens)
        assert choice.token_ids == expected.token_ids and choice.logprobs == expected.logprobs
    assert [grouped.history(i) for i in range(4)] == [whole.history(i) for i in range(4)]
    assert torch.equal(grouped.tensors.counts, whole.tensors.counts)


def test_a_prefix_view_is_rebuilt_after_the_batch_changes():
    batch = DecodingBatch(V)
    _fill(batch)
    view = batch.prefix(2)
    assert batch.prefix(2) is view and batch.prefix(4) is batch
    batch.reorder([1, 0, 2, 3])
    rebuilt = batch.prefix(2)
    assert rebuilt is not view and rebuilt.rows == batch.rows[:2]
    middle = batch.slice(1, 3)
    assert batch.slice(1, 3) is middle and middle.rows == batch.rows[1:3]
