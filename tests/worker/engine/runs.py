"""Drive a real Engine the way the worker server does: start it, submit, collect the events, wait for the end."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from common.protocol import (
    Accepted,
    Done,
    Error,
    Finish,
    GenerateRequest,
    SamplingParams,
    Token,
)
from testkit.sluice import GRAMMAR_COMPILE_LIMIT_S


@dataclass
class Run:
    request_id: str = ""
    strict: bool = False  # wait() also asserts the engine reported no error
    events: list = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)

    def sink(self, batch: list) -> None:
        self.events.extend(batch)
        if any(isinstance(e, (Done, Error)) for e in batch):
            self.ended.set()

    def wait(self, timeout: float = 300.0) -> Run:
        assert self.ended.wait(timeout), "the engine did not finish the request in time"
        if self.strict:
            errors = self.of(Error)
            assert not errors, errors
        return self

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def accepted(self) -> Accepted:
        return self.of(Accepted)[0]

    @property
    def finishes(self) -> list[Finish]:
        return sorted(self.of(Finish), key=lambda f: f.index)

    @property
    def done(self) -> Done:
        return self.of(Done)[0]

    def tokens(self, index: int = 0) -> list[Token]:
        return [t for t in self.of(Token) if t.index == index]


_counter = iter(range(10**9))


def request(prompt=None, **params) -> GenerateRequest:
    ids = params.pop("prompt_ids", None)
    extra = {k: params.pop(k) for k in ("messages", "input_embeds", "token_index_to_replace",
                                        "embedding_to_replace", "deadline_unix", "tenant", "priority") if k in params}
    return GenerateRequest(request_id=f"req-{next(_counter)}", model="m", prompt=prompt, prompt_ids=ids,
                           params=SamplingParams(**params), **extra)


def submit(engine, generate: GenerateRequest, strict: bool = False) -> Run:
    run = Run(generate.request_id, strict)
    engine.submit(engine.prepare(generate), run.sink)
    return run


def generate(engine, prompt=None, **params) -> Run:
    return submit(engine, request(prompt, **params)).wait()


@contextlib.contextmanager
def running_engine(smol, worker_id: str, **config):
    """A started Engine on the shared weights, stopped on exit; a grammar compile limit that cannot trip unless
    the test sets its own."""
    from common.protocol import ModelConfig
    from worker.engine.engine import Engine

    config.setdefault("grammar_compile_timeout_s", GRAMMAR_COMPILE_LIMIT_S)
    running = Engine(smol, ModelConfig(**config), worker_id)
    running.start()
    try:
        yield running
    finally:
        running.stop()
