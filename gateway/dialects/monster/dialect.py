"""MonsterAPI `POST /v1/generate`: a flat vLLM-style body; the response schema is ours (none is published).

Request: `model`, one of `prompt` / `formatted_prompt` (already formatted text) or `messages` (the
worker applies the chat template), `max_tokens` (256), `n` (1), `best_of`, `use_beam_search`
(`best_of` beams, `n` returned), `length_penalty`, `early_stopping`, the penalties, `temperature` (1),
`top_p` (1), `top_k` (-1 = off), `min_p` (0), `stream` (false), `mock_response`.

Response (documented in docs/api.md):
    {"id", "object": "text_completion", "created", "model", "text": [str per choice],
     "choices": [{"index", "text", "finish_reason": "stop"|"length"}],
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
`mock_response: true` answers a canned body of that shape (usage all zero) without reaching a worker
and without being billed. Streams are OpenAI-style completion chunks ending with `[DONE]`.
"""

from __future__ import annotations

import time
import uuid

import msgspec

from common.protocol import GenerateRequest, SamplingParams
from gateway.dialects.openai.chat import normalise_messages
from gateway.dialects.openai.completions import FINISH, OpenAICompletions, Options, usage
from gateway.dialects.openai.request import MAX_BEAMS
from gateway.serving.collect import Result
from gateway.serving.dialect import Meta, Parsed, check, convert, incomplete

MOCK_TEXT = "This is a mock response from Sluice; no model was run."


class MonsterBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    formatted_prompt: str | None = None
    messages: list | None = None
    max_tokens: int | None = None
    n: int | None = None
    best_of: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    early_stopping: bool | None = None
    stream: bool | None = None
    mock_response: bool | None = None


def _d(value, default):
    return default if value is None else value


def _validate(body: MonsterBody) -> None:
    check(bool(body.model), "model is required", "model")
    given = [k for k in ("prompt", "formatted_prompt", "messages") if getattr(body, k) is not None]
    check(len(given) == 1, "give exactly one of prompt, formatted_prompt or messages", "prompt")
    check(body.max_tokens is None or body.max_tokens >= 1, "max_tokens must be at least 1", "max_tokens")
    check(body.temperature is None or 0 <= body.temperature <= 2, "temperature must be between 0 and 2",
          "temperature")
    check(body.top_p is None or 0 < body.top_p <= 1, "top_p must be in (0, 1]", "top_p")
    check(body.top_k is None or body.top_k == -1 or body.top_k >= 1, "top_k must be -1 (off) or >= 1", "top_k")
    check(body.min_p is None or 0 <= body.min_p <= 1, "min_p must be in [0, 1]", "min_p")
    check(body.repetition_penalty is None or body.repetition_penalty > 0, "repetition_penalty must be > 0",
          "repetition_penalty")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        check(value is None or -2 <= value <= 2, f"{name} must be between -2 and 2", name)


class MonsterGenerate(OpenAICompletions):
    """Reuses the completions stream framing; parse and the non-streamed body are MonsterAPI's own."""

    name = "monster"
    openai_errors = False  # MonsterAPI's FastAPI server answers a bad body with 422

    def __init__(self) -> None:
        super().__init__(friendli=False)
        self.name = "monster"

    def parse(self, payload, route: str) -> Parsed:
        body = convert(payload, MonsterBody)
        _validate(body)
        n = _d(body.n, 1)
        # LLMClient always sends best_of=1 (its default): 1 or null means "as many as n"
        best_of = n if body.best_of in (None, 1) else body.best_of
        check(1 <= n <= 128, "n must be between 1 and 128", "n")
        check(n <= best_of <= 128, "best_of must be between n and 128", "best_of")
        beam = bool(body.use_beam_search)
        check(not beam or best_of > 1, "use_beam_search needs best_of > 1 (the number of beams)", "best_of")
        check(not beam or best_of <= MAX_BEAMS, f"use_beam_search takes at most {MAX_BEAMS} beams (best_of)",
              "best_of")
        stream = bool(body.stream)
        check(not (stream and (beam or best_of > n)), "beam search and best_of > n cannot be streamed", "stream")
        params = SamplingParams(
            max_tokens=_d(body.max_tokens, 256), n=n, best_of=None if beam or best_of == n else best_of,
            num_beams=best_of if beam else 1, length_penalty=_d(body.length_penalty, 1.0),
            early_stopping=bool(body.early_stopping), temperature=_d(body.temperature, 1.0),
            top_p=_d(body.top_p, 1.0), top_k=max(_d(body.top_k, -1), 0), min_p=_d(body.min_p, 0.0),
            presence_penalty=_d(body.presence_penalty, 0.0), frequency_penalty=_d(body.frequency_penalty, 0.0),
            repetition_penalty=_d(body.repetition_penalty, 1.0))
        messages = normalise_messages(body.messages) if body.messages is not None else None
        request = GenerateRequest(request_id="", model=body.model, prompt=_d(body.prompt, body.formatted_prompt),
                                  messages=messages, params=params, stream=stream)
        parsed = Parsed(body.model, [request], stream, Options(False, False, None, n))
        if body.mock_response:
            check(not stream, "mock_response cannot be streamed", "mock_response")
            parsed.extra["mock_response"] = mock_body(body.model, n)
        return parsed

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> dict:
        choices = [{"index": c.finish.index, "text": c.finish.text, "finish_reason": FINISH[c.finish.reason],
                    **incomplete(c.finish)} for c in results[0].ordered()]
        return {"id": f"gen-{meta.request_id}", "object": "text_completion", "created": meta.created,
                "model": meta.model, "text": [c["text"] for c in choices], "choices": choices,
                "usage": usage(results, cached=False)}


def mock_body(model: str, n: int) -> dict:
    choices = [{"index": i, "text": MOCK_TEXT, "finish_reason": "stop"} for i in range(n)]
    return {"id": f"gen-mock-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": model, "text": [MOCK_TEXT] * n, "choices": choices,
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "mock": True}
