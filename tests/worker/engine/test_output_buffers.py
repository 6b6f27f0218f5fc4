"""The native forward's logits memory: handed out again only once nothing made from it is alive."""

from __future__ import annotations

import pytest
import torch

from worker.engine.native.output_buffers import KEPT, MAX_KEPT_BYTES, OutputBuffers


def test_a_dropped_output_s_memory_serves_the_next_call():
    buffers = OutputBuffers()
    first = buffers.empty(4, 1000)
    address = first.data_ptr()
    assert first.shape == (4, 1000) and first.dtype == torch.float32
    del first
    again = buffers.empty(3, 1000)  # smaller: the same memory
    assert again.data_ptr() == address and again.shape == (3, 1000)


@pytest.mark.parametrize("keep", [lambda t: t[1:], lambda t: t.to(torch.float32, copy=False)[0],
                                  lambda t: t.numpy()[0]], ids=["slice", "itself", "array"])
def test_memory_a_view_still_holds_is_never_handed_out_again(keep):
    buffers = OutputBuffers()
    logits = buffers.empty(2, 64)
    logits.fill_(1.0)
    address = logits.data_ptr()
    held = keep(logits)  # what a step kept of its logits
    del logits
    other = buffers.empty(2, 64)
    other.fill_(7.0)  # the next step writes its own
    assert other.data_ptr() != address and float(torch.as_tensor(held).min()) == 1.0
    del held, other
    assert buffers.empty(2, 64).data_ptr() == address  # nothing holds it now: it serves again


def test_at_most_kept_buffers_of_bounded_size_stay():
    buffers = OutputBuffers()
    held = [buffers.empty(8, 128) for _ in range(KEPT)]
    extra = buffers.empty(8, 128)  # every kept buffer is in use: memory of its own
    assert extra.data_ptr() not in {h.data_ptr() for h in held}
    assert len(buffers._buffers) == KEPT
    huge = buffers.empty(MAX_KEPT_BYTES // 4 // 1024 + 1, 1024)  # over the bound: never kept
    assert len(buffers._buffers) == KEPT and all(len(b) < MAX_KEPT_BYTES for b in buffers._buffers)
    del huge, extra
    del held[0]
    bigger = buffers.empty(16, 128)  # the free buffer is too small: replaced by one that fits
    assert bigger.shape == (16, 128) and len(buffers._buffers) == KEPT
    assert sorted(len(b) for b in buffers._buffers) == [8 * 128 * 4, 16 * 128 * 4]


def test_an_empty_output_is_a_plain_tensor():
    assert OutputBuffers().empty(0, 10).shape == (0, 10)
