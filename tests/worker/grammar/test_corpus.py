"""Every output of the corpus validates: each schema and regex, greedy and sampled, all in one busy batch."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial

import pytest

from common.protocol import Constraint
from testkit.corpora.grammar import REGEXES, SCHEMAS
from tests.worker.grammar.helpers import (
    HANG_GUARD_S,
    ask,
    check_regex_output,
    check_schema_output,
    schema_constraint,
    submit,
)

# the fixture compiles every grammar of the corpus (niced below the engine) and decodes them all: on a machine
# loaded to 8 runnable processes a core that is longer than pytest-timeout's default 600 s; this is a hang guard
pytestmark = pytest.mark.timeout(HANG_GUARD_S)
MODES = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.9, "top_p": 0.95, "seed": [7]}}
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def corpus_runs(grammar_engine):
    """Submit the whole corpus at once, so constrained rows of different grammars share the batch (prepared on
    a few threads, as the worker prepares its requests, so that every compile thread has work)."""
    requests = {}
    for name, schema in SCHEMAS:
        for mode, params in MODES.items():
            prompt = f"Reply with JSON only ({name.replace('_', ' ')}), following this schema: {json.dumps(schema)}"
            requests[("schema", name, mode)] = ask(prompt, max_tokens=MAX_TOKENS, constraint=schema_constraint(schema),
                                                   **params)
    for name, pattern in REGEXES:
        for mode, params in MODES.items():
            requests[("regex", name, mode)] = ask(f"Give one example of a {name.replace('_', ' ')}.",
                                                  max_tokens=MAX_TOKENS, constraint=Constraint("regex", pattern),
                                                  **params)
    with ThreadPoolExecutor(4) as pool:
        runs = dict(zip(requests, pool.map(partial(submit, grammar_engine), requests.values())))
    return {key: run.wait(HANG_GUARD_S).finishes[0] for key, run in runs.items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schema_output_validates(corpus_runs, name, schema, mode):
    finish = corpus_runs[("schema", name, mode)]
    if check_schema_output(finish, schema) and name == "format_datetime":  # jsonschema skips date-time
        datetime.fromisoformat(json.loads(finish.text)["at"].replace("Z", "+00:00"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,pattern", REGEXES, ids=[n for n, _ in REGEXES])
def test_regex_output_fullmatches(corpus_runs, name, pattern, mode):
    check_regex_output(corpus_runs[("regex", name, mode)], pattern)


def test_almost_every_output_completes(corpus_runs):
    """A cut output is allowed (and marked), but the corpus is sized so nearly all of them finish."""
    cut = [key for key, finish in corpus_runs.items() if finish.reason == "length"]
    assert len(cut) <= len(corpus_runs) // 10, cut
