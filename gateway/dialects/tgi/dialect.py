"""TGI (text-generation-inference) native API, also DataCrunch's: parse `{"inputs", "parameters"}` (see
`request.py`), render replies and the `{"error", "error_type"}` envelope.

Streams send one `data:` event per token, the last one carrying `generated_text` and `details`, and
end by closing the connection: no `[DONE]` (the `text-generation` client cannot parse it).
`best_of` runs every candidate as an ordinary choice and ranks them here by cumulative logprob, so
the best sequence and `best_of_sequences` all carry their tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from common.protocol import (
    Accepted,
    Event,
    Finish,
    GenerateRequest,
    SamplingParams,
    Token,
    Watermark,
)
from gateway.dialects.tgi.request import GenerateBody, Parameters, grammar_constraint, sampling_of, validate
from gateway.errors import QuotaExceeded, SluiceError, restated
from gateway.serving.collect import Choice, Result
from gateway.serving.dialect import Dialect, Meta, Parsed, check, convert, incomplete, sse

# a failed choice ("error", "cancelled") never reaches rendering: gateway.serving.answer.honest fails the request
FINISH = {"length": "length", "eos_token": "eos_token", "stop_sequence": "stop_sequence", "stop_token": "eos_token"}
# status -> TGI's own error_type (validation 422, generation 424, overloaded 429, incomplete_generation 500): what
# huggingface_hub maps to its typed errors. A refusal TGI itself never makes (401, 403, 404, timeouts: the proxy in
# front of it) has no error_type, as Hugging Face's endpoints answer it: huggingface_hub then raises its HTTP error
# of that status instead of an UnknownError.
ERROR_TYPES = {400: "validation", 413: "validation", 415: "validation", 422: "validation", 429: "overloaded",
               503: "overloaded", 502: "generation", 500: "incomplete_generation"}


@dataclass
class Options:
    details: bool
    prefill: bool
    top_n: int | None
    best_of: int
    sampling: bool
    full_text: str  # prepended to generated_text (return_full_text), else ""
    compat: bool  # POST /: the non-streamed body is a one-element array


class TGI(Dialect):
    name = "tgi"
    model_optional = True  # TGI has no model field; DataCrunch's is optional

    def __init__(self, default_max_new_tokens: int = 100, compat: bool = False, stream: bool | None = None,
                 name: str = "tgi"):
        self.name = name  # the ledger's dialect: DataCrunch's routes speak TGI's bodies but are DataCrunch's
        self.default_max_new_tokens = default_max_new_tokens
        self.compat = compat  # POST /: `stream` in the body, array reply
        self.route_stream = stream  # /generate: False, /generate_stream: True

    def parse(self, payload, route: str) -> Parsed:
        body = convert(payload, GenerateBody)
        check(body.inputs != "", "`inputs` cannot be empty", "inputs")
        p = body.parameters or Parameters()
        stream = bool(body.stream) if self.route_stream is None else self.route_stream
        validate(p, stream)
        sampling = sampling_of(p)
        best_of = p.best_of or 1
        details = bool(p.details)
        max_new = p.max_new_tokens if p.max_new_tokens is not None else self.default_max_new_tokens
        params = SamplingParams(
            max_tokens=max_new, truncate=p.truncate,
            temperature=(p.temperature if p.temperature is not None else 1.0) if sampling else 0.0,
            top_k=p.top_k or 0, top_p=p.top_p if p.top_p is not None else 1.0,
            typical_p=p.typical_p if p.typical_p is not None else 1.0,
            seed=[p.seed] if p.seed is not None else None,
            repetition_penalty=p.repetition_penalty if p.repetition_penalty is not None else 1.0,
            frequency_penalty=p.frequency_penalty or 0.0, stop=list(p.stop or []), n=best_of,
            # details and stream tokens carry the chosen token's logprob; top_n_tokens adds the top N
            logprobs=p.top_n_tokens or 0, prompt_logprobs=bool(p.decoder_input_details),
            constraint=grammar_constraint(p.grammar), watermark=Watermark() if p.watermark else None)
        request = GenerateRequest(request_id="", model=body.model or "", prompt=body.inputs, params=params)
        options = Options(details, bool(p.decoder_input_details), p.top_n_tokens or None, best_of, sampling,
                          body.inputs if p.return_full_text else "", self.compat)
        return Parsed(body.model or "", [request], stream, options, adapter=p.adapter_id, adapter_field="adapter_id")

    # ---- rendering ----

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> Any:
        options: Options = parsed.options
        result = results[0]
        ranked = sorted(result.ordered(), key=lambda c: c.finish.cumulative_logprob, reverse=True)
        best = ranked[0]
        body: dict = {"generated_text": options.full_text + full_text(best.finish)}
        if options.details:
            details = self._sequence(best, result.accepted, options)
            del details["generated_text"]
            if options.best_of > 1:
                details["best_of_sequences"] = [self._sequence(c, result.accepted, options) for c in ranked[1:]]
            body["details"] = details
        return [body] if options.compat else body

    def _sequence(self, choice: Choice, accepted: Accepted | None, options: Options) -> dict:
        finish = choice.finish
        return {"generated_text": options.full_text + full_text(finish), "finish_reason": FINISH[finish.reason],
                "generated_tokens": len(finish.token_ids), "seed": finish.seed if options.sampling else None,
                "prefill": prefill(accepted) if options.prefill else [],
                "tokens": token_list(choice.tokens, finish),
                **({"top_tokens": [top_tokens(t) for t in choice.tokens]} if options.top_n else {}),
                **incomplete(finish)}

    def response_headers(self, parsed: Parsed, results: list[Result], elapsed: float,
                         checked: float) -> dict[str, str]:
        """TGI's timing headers in milliseconds: validation (gateway checks + the worker's tokenizing),
        queue (waiting for the engine), inference (the rest)."""
        done = results[0].done if results else None
        accepted = results[0].accepted if results else None
        generated = done.completion_tokens if done else 0
        validation = checked + (accepted.validation_time_s if accepted else 0.0)
        queue = accepted.queue_time_s if accepted else 0.0
        inference = max(0.0, elapsed - validation - queue)
        return {"x-compute-type": "sluice", "x-compute-time": f"{elapsed:.3f}",
                "x-compute-characters": str(len(parsed.requests[0].prompt or "")),
                "x-total-time": _millis(elapsed), "x-validation-time": _millis(validation),
                "x-queue-time": _millis(queue), "x-inference-time": _millis(inference),
                "x-time-per-token": _millis(inference / max(generated, 1)),
                "x-prompt-tokens": str(done.prompt_tokens if done else 0), "x-generated-tokens": str(generated)}

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]],
                     meta: Meta) -> AsyncIterator[bytes]:
        options: Options = parsed.options
        held: Token | None = None  # the last token waits: its event carries generated_text and details
        count = 0
        async for _, event in events:
            if isinstance(event, Token):
                if held is not None:
                    yield sse(stream_event(held, count, options), space=False)
                    count += 1
                held = event
            elif isinstance(event, Finish) and held is not None:
                held.text += stop_text(event)
                final = stream_event(held, count, options)
                final["generated_text"] = options.full_text + full_text(event)
                if options.details:
                    final["details"] = {"finish_reason": FINISH[event.reason],
                                        "generated_tokens": len(event.token_ids),
                                        "seed": event.seed if options.sampling else None, **incomplete(event)}
                yield sse(final, space=False)
                held = None

    def reported(self, error: SluiceError) -> SluiceError:
        """A spent budget as Hugging Face's hosted inference answers credit run out: 402, with no `error_type` (TGI
        itself has no quota), so huggingface_hub raises its HTTP error of status 402, not an OverloadedError."""
        return restated(error, 402) if isinstance(error, QuotaExceeded) else error

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        error = self.reported(error)
        error_type = ERROR_TYPES.get(error.status)
        return error.status, {"error": error.message, **({"error_type": error_type} if error_type else {}),
                              **error.fields}

    def stream_error(self, error: SluiceError) -> bytes:
        return sse(self.error_body(error)[1], space=False)


def _millis(seconds: float) -> str:
    return str(round(seconds * 1000))


def stop_text(finish: Finish) -> str:
    """TGI keeps the matched stop sequence in the output; the worker trims it."""
    return finish.matched_stop if finish.reason == "stop_sequence" and isinstance(finish.matched_stop, str) else ""


def full_text(finish: Finish) -> str:
    return finish.text + stop_text(finish)


def token_json(token: Token) -> dict:
    return {"id": token.token_id, "text": token.text, "logprob": token.logprob, "special": token.special}


def token_list(tokens: list[Token], finish: Finish) -> list[dict]:
    """Token texts are the decoded deltas, so they concatenate to generated_text (stop text included)."""
    out = [token_json(t) for t in tokens]
    if out:
        out[-1]["text"] += stop_text(finish)
    return out


def top_tokens(token: Token) -> list[dict]:
    return [{"id": t.token_id, "text": t.text, "logprob": t.logprob, "special": False}
            for t in token.top_logprobs or []]


def prefill(accepted: Accepted | None) -> list[dict]:
    if accepted is None or accepted.prompt_details is None:
        return []
    return [{"id": t.id, "text": t.text, "logprob": t.logprob} for t in accepted.prompt_details]


def stream_event(token: Token, index: int, options: Options) -> dict:
    return {"index": index, "token": token_json(token),
            "top_tokens": top_tokens(token) if options.top_n else [], "generated_text": None, "details": None}
