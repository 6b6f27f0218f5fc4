"""Beam rows sitting out steps for ordinary rows (beam_budget.py) changes no result: ordinary requests
that join while beam requests run take slots ahead of the beam rows, and every request gives exactly
what it gives alone."""

from __future__ import annotations

import pytest

from common.protocol import Accepted, ModelConfig
from tests.worker.beam.helpers import Collector, request, run_all
from tests.worker.beam.tiny import tiny_model
from worker.engine.engine import Engine

BEAMS = [dict(num_beams=3, max_tokens=24, min_tokens=24),
         dict(num_beams=2, n=2, max_tokens=18, min_tokens=18, beam_search_type="NAIVE_SAMPLING", seed=[4])]
ORDINARY = [dict(max_tokens=10, min_tokens=10, temperature=0.0),
            dict(max_tokens=14, min_tokens=14, temperature=0.9, seed=[3], n=2),
            dict(max_tokens=6, min_tokens=6, temperature=0.0, repetition_penalty=1.3)]


@pytest.fixture(scope="module")
def engine():
    running = Engine(tiny_model(), ModelConfig(max_batch_size=16, max_context=64, ordinary_share_beside_beams=0.6),
                     "budget-worker")
    running.start()
    yield running
    running.stop()


def _outputs(collector: Collector) -> list[list[int]]:
    return [f.token_ids for f in sorted(collector.finishes, key=lambda f: f.index)]


def test_ordinary_requests_joining_running_beams_change_nothing(engine):
    alone = [_outputs(run_all(engine, [request([1, 2 + i], **params)])[0]) for i, params in enumerate(BEAMS + ORDINARY)]
    beams = [Collector() for _ in BEAMS]
    for i, (params, sink) in enumerate(zip(BEAMS, beams)):
        engine.submit(engine.prepare(request([1, 2 + i], **params)), sink)
    for sink in beams:  # wait until both beam requests hold rows, so the ordinary ones join behind them
        while not any(isinstance(e, Accepted) for e in sink.events):
            sink.finished.wait(0.01)
    ordinary = run_all(engine, [request([1, 2 + len(BEAMS) + i], **p) for i, p in enumerate(ORDINARY)])
    for sink in beams:
        assert sink.finished.wait(120)
    assert [_outputs(c) for c in beams + ordinary] == alone
    budget = engine.beam_budget
    assert budget.ordinary_s is not None and budget.full_s is not None, "both kinds of mixed step ran"
    assert not engine.rows
