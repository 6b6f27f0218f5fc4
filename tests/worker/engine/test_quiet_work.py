"""Start-up work that waits for the engine's first quiet moment (worker/engine/quiet_work.py): never beside a
woken worker's first burst, and done once it is over."""

from __future__ import annotations

import time

from common.protocol import Constraint, ModelConfig
from tests.worker.beam.tiny import tiny_model
from tests.worker.engine.runs import request, submit
from worker.engine.engine import Engine
from worker.engine.quiet_work import QuietWork


def test_work_waits_for_a_quiet_spell_counted_from_its_arrival_and_from_the_last_activity():
    done: list[str] = []
    work = QuietWork(quiet_s=2.0)
    work.add(lambda: done.append("vocabulary"), now=10.0)  # the engine was idle long before: counted from now
    work.run_if_quiet(11.0)
    assert done == [] and work.pending
    work.busy(11.5)  # the burst's requests
    work.busy(12.5)
    work.run_if_quiet(14.0)
    assert done == []
    work.run_if_quiet(14.5)
    assert done == ["vocabulary"] and not work.pending
    work.run_if_quiet(30.0)
    assert done == ["vocabulary"]  # once


def test_a_started_worker_makes_its_grammar_machinery_for_its_first_structured_request_only(tmp_path):
    """The vocabulary table and the compile processes (a fork server importing xgrammar and torch: seconds of
    a core, ~500 MB) wait for the first structured request: a worker serving plain text never pays them."""
    config = ModelConfig(name="tiny", max_batch_size=4, max_context=64, decode_threads=1)
    engine = Engine(tiny_model(), config, "quiet", tmp_path, compile_later=True)
    engine.start()
    try:
        engine.warm_up()
        engine.finish_start()
        served = submit(engine, request(prompt_ids=[1, 2, 3], max_tokens=4, ignore_eos=True, temperature=0.0)).wait()
        assert len(served.finishes[0].token_ids) == 4
        deadline = time.monotonic() + 120
        while engine.quiet_work.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not engine.quiet_work.pending
        assert not engine.grammars._xgr_ready.done() and not engine.grammars._processes
        constrained = submit(engine, request(prompt_ids=[1, 2, 3], max_tokens=8, temperature=0.0,
                                             constraint=Constraint("regex", "[\\s\\S]*"))).wait()
        assert engine.grammars._xgr_ready.done() and engine.grammars._processes
        assert constrained.finishes and constrained.finishes[0].reason in ("eos_token", "length"), constrained.finishes
    finally:
        engine.stop()
