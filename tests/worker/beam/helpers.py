"""Run requests through a real Engine (its own thread) and collect each request's events."""

from __future__ import annotations

import threading
import uuid

from common.protocol import Done, Error, Finish, GenerateRequest, SamplingParams
from worker.engine.engine import Engine


class Collector:
    def __init__(self) -> None:
        self.events: list = []
        self.finished = threading.Event()

    def __call__(self, batch: list) -> None:
        self.events.extend(batch)
        if any(isinstance(e, (Done, Error)) for e in batch):
            self.finished.set()

    @property
    def finishes(self) -> list[Finish]:
        return [e for e in self.events if isinstance(e, Finish)]

    @property
    def done(self) -> Done:
        return next(e for e in self.events if isinstance(e, Done))


def request(prompt_ids: list[int], **params) -> GenerateRequest:
    return GenerateRequest(request_id=uuid.uuid4().hex, model="test", prompt_ids=list(prompt_ids),
                           params=SamplingParams(**params))


def run_all(engine: Engine, requests: list[GenerateRequest], timeout: float = 600) -> list[Collector]:
    """Submit every request at once (they share the batch) and wait for all of them."""
    prepared = [engine.prepare(r) for r in requests]
    collectors = [Collector() for _ in requests]
    for item, sink in zip(prepared, collectors):
        engine.submit(item, sink)
    for sink in collectors:
        assert sink.finished.wait(timeout), "the engine did not answer in time"
        errors = [e for e in sink.events if isinstance(e, Error)]
        assert not errors, errors
    return collectors
