"""Run requests through a real Engine (its own thread) and collect each request's events; transformers' own beam
search as the reference."""

from __future__ import annotations

import threading
import uuid

import torch

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


def beam_reference(model, ids: list[int], params: dict, eos: list[int]) -> tuple[list[list[int]], list[float]]:
    """transformers' beam search: the returned sequences (cut after their end token) and scores."""
    ends = eos + params.get("stop_token_ids", [])
    kwargs = dict(num_beams=params["num_beams"], do_sample=False, max_new_tokens=params["max_tokens"],
                  num_return_sequences=params.get("n", 1), length_penalty=params.get("length_penalty", 1.0),
                  early_stopping=params.get("early_stopping", False), min_new_tokens=params.get("min_tokens", 0),
                  no_repeat_ngram_size=params.get("no_repeat_ngram_size", 0),
                  repetition_penalty=params.get("repetition_penalty", 1.0),
                  bad_words_ids=params.get("bad_word_tokens"), eos_token_id=ends, pad_token_id=eos[0],
                  return_dict_in_generate=True, output_scores=True)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             **kwargs)
    sequences = []
    for row in out.sequences[:, len(ids):].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
        sequences.append(row[:cut])
    return sequences, out.sequences_scores.tolist()
