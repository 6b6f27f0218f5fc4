"""Gateway ↔ worker: grammar compiles take at most half the worker's cores, whoever sends them (issue #43, item 8).

Compile processes run niced below the engine, but two teams compiling heavy schemas on a 2-core worker still ran a
process on each core (one compile thread and process per team), and another team's time to first token rose to
6.7-11.5x idle. Now there is one compile thread, and so one compile process, for every two cores the worker may
use (at least one), shared round robin among tenants: however many teams send schemas, the engine keeps the other
half. Checked by the processes that exist, never by time; `bench/fairness.py --attack grammar` measures it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from common.protocol import Constraint, ModelConfig
from testkit.sluice import MODEL_CACHE
from worker.decoding.grammar import GrammarCompiler
from worker.decoding.grammar.compiler import compile_threads


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from worker.loading import load_model

    os.environ["SLUICE_MODEL_CACHE"] = str(MODEL_CACHE)
    return load_model(ModelConfig(dtype="float32", quantization="none"), Path(tmp_path_factory.mktemp("data")))


def test_compiles_run_in_one_process_for_every_two_cores_whoever_sends_them(smol):
    from worker.engine.engine import _model_eos_ids

    cores = len(os.sched_getaffinity(0))
    assert compile_threads() == max(1, cores // 2)
    compiler = GrammarCompiler(smol.tokenizer, smol.model.config.vocab_size, _model_eos_ids(smol), timeout_s=600)
    try:
        for team in ("team-a", "team-b", "team-c"):  # each its own schemas: compiled (never cached) per team
            for index in range(2):
                schema = {"type": "object", "properties": {f"{team}_{index}": {"type": "integer"}}}
                compiler.compile(Constraint("json_schema", json.dumps(schema)), tenant=team)
        processes = [p for p in compiler._processes if p.pid is not None and psutil.pid_exists(p.pid)]
        assert 1 <= len(compiler._processes) <= max(1, cores // 2), (len(compiler._processes), cores)
        assert len(processes) <= max(1, cores // 2)
    finally:
        compiler.close()
