"""The worker's queue bound counts every request submitted and not yet started, the engine's inbox
included: a burst that arrives while the engine thread is busy in one long step is bounded too. It bounds
the requests that would wait for a row: those beyond the free rows (max_queue 0 = none waits)."""

from __future__ import annotations

import pytest

from common.protocol import Error, ModelConfig
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import request, submit
from worker.engine.engine import Engine
from worker.engine.prepare import RequestRejected


def test_max_queue_bounds_what_the_engine_has_not_taken_in_yet():
    """Before its thread runs, the engine has drained nothing: every submission waits in the inbox, as
    a burst does while a long prefill or decode step runs. The old bound counted only `waiting`."""
    engine = Engine(tiny_model(), ModelConfig(max_batch_size=2, max_context=64, max_queue=3), "queue-bound")
    runs = [submit(engine, request(prompt_ids=[1, 2 + i], max_tokens=3, temperature=0.0)) for i in range(5)]
    assert engine.load().queued == 5  # two for the free rows, three waiting
    with pytest.raises(RequestRejected) as refused:
        submit(engine, request(prompt_ids=[1, 5], max_tokens=3))
    assert refused.value.kind == "overloaded"
    engine.start()
    try:
        for run in runs:
            assert not run.wait(60).of(Error)
        assert engine.load().queued == 0
        again = [submit(engine, request(prompt_ids=[1, 3], max_tokens=2)) for _ in range(5)]  # room again
        for run in again:
            assert not run.wait(60).of(Error)
    finally:
        engine.stop()


def test_cancelled_and_expired_requests_leave_the_queue_count():
    engine = Engine(tiny_model(), ModelConfig(max_batch_size=2, max_context=64, max_queue=2), "queue-leave")
    cancelled = submit(engine, request(prompt_ids=[1, 2], max_tokens=3))
    expired = submit(engine, request(prompt_ids=[1, 3], max_tokens=3, deadline_unix=1.0))  # long past
    engine.cancel(cancelled.request_id)
    engine.start()
    try:
        cancelled.wait(60)
        assert expired.wait(60).of(Error)[0].kind == "timeout"
        assert engine.load().queued == 0
        runs = [submit(engine, request(prompt_ids=[1, 4], max_tokens=2)) for _ in range(2)]
        for run in runs:
            assert not run.wait(60).of(Error)
    finally:
        engine.stop()


def test_no_queue_takes_as_many_requests_as_free_rows_and_the_warm_up_passes():
    """max_queue 0 is "no waiting", not "no requests": old main refused every submission, the worker's own
    warm-up included, and the worker died at start."""
    engine = Engine(tiny_model(), ModelConfig(max_batch_size=2, max_context=64, max_queue=0), "no-queue")
    runs = [submit(engine, request(prompt_ids=[1, 2 + i], max_tokens=3)) for i in range(2)]  # the free rows
    with pytest.raises(RequestRejected) as refused:  # a third would wait for a row
        submit(engine, request(prompt_ids=[1, 5], max_tokens=3))
    assert refused.value.kind == "overloaded"
    engine.warm_up(timeout_s=0)  # the worker's own requests pass the bound even now
    engine.start()
    try:
        for run in runs:
            assert not run.wait(60).of(Error)
        engine.warm_up(timeout_s=120)
        assert engine.load().queued == 0
    finally:
        engine.stop()
