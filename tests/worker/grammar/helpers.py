"""Submit requests to a real Engine and collect their events; check outputs against their constraint."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal

import jsonschema

from common.protocol import Constraint, Finish, GenerateRequest, SamplingParams
from tests.worker.engine.runs import Run
from tests.worker.engine.runs import submit as engine_submit

_ids = itertools.count()
# how long a test waits for the engine or a compile: a hang guard, never a speed bound (a loaded machine is slow)
HANG_GUARD_S = 3600.0


def ask(prompt: str, **params) -> GenerateRequest:
    return GenerateRequest(request_id=f"grammar-{next(_ids)}", model="m",
                           messages=[{"role": "user", "content": prompt}], params=SamplingParams(**params))


def submit(engine, request: GenerateRequest) -> Run:
    """Submit; `wait()` on the result also asserts the engine reported no error."""
    return engine_submit(engine, request, strict=True)


def generate(engine, prompt: str, **params) -> Run:
    return submit(engine, ask(prompt, **params)).wait(HANG_GUARD_S)


def schema_constraint(schema) -> Constraint:
    return Constraint("json_schema", json.dumps(schema))


def check_schema_output(finish: Finish, schema) -> bool:
    """True when complete and valid; False when cut (then it must say so); raises when invalid."""
    if finish.reason == "length":
        assert finish.incomplete, f"a cut output must be marked incomplete: {finish.text!r}"
        return False
    assert finish.reason == "eos_token", (finish.reason, finish.text)
    assert not finish.incomplete, finish.text
    value = json.loads(finish.text)
    jsonschema.validate(value, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return True


def check_regex_output(finish: Finish, pattern: str) -> bool:
    if finish.reason == "length":
        assert finish.incomplete, f"a cut output must be marked incomplete: {finish.text!r}"
        return False
    assert finish.reason == "eos_token" and not finish.incomplete, (finish.reason, finish.text)
    assert re.fullmatch(pattern, finish.text), (pattern, finish.text)
    return True


@contextlib.contextmanager
def compiles_held(compiler):
    """Every compile process of `compiler` stopped (SIGSTOP) for the block: a compile sent to one cannot finish
    before the block ends, whatever the machine's load. Enter it with no compile running."""
    compiler._tokenizer  # noqa: B018 - builds the vocabulary and one started process per compile thread
    held = []
    for process in list(compiler._processes):
        process._ready(HANG_GUARD_S)  # it has read the tokenizer's table, so a compile sent to it is timed as a compile
        held.append(process.pid)
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield held
    finally:
        for pid in held:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
