"""Anthropic's Messages API on the shared engine: parse into one chat GenerateRequest, render a `message`
(content blocks `text` and `tool_use`, `stop_reason`, `usage`), stream Anthropic's event sequence, and answer
errors in Anthropic's envelope `{"type": "error", "error": {"type", "message"}}` with its status codes.

Stream: `message_start`, `ping`, then per content block `content_block_start`, its `content_block_delta`s
(`text_delta`, or `input_json_delta` for a tool call's arguments) and `content_block_stop`, then `message_delta`
(stop reason, output tokens) and `message_stop`; an error after the start is an `error` event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from common.protocol import (
    Accepted,
    Done,
    Event,
    Finish,
    GenerateRequest,
    SamplingParams,
    Token,
    ToolCall,
    ToolCallDelta,
)
from gateway.dialects import bounds
from gateway.dialects.anthropic.request import (
    MAX_STOP_SEQUENCES,
    TOLERATED,
    MessagesBody,
    conversation,
    output_format,
    prefill,
    tools,
)
from gateway.errors import ContextTooLong, Overloaded, QuotaExceeded, SluiceError, ValidationFailed, restated
from gateway.serving.collect import Result
from gateway.serving.dialect import Dialect, Meta, Parsed, check, convert, fail, required, sse, unknown_fields

STOP_REASONS = {"eos_token": "end_turn", "stop_token": "end_turn", "stop_sequence": "stop_sequence",
                "length": "max_tokens", "tool_calls": "tool_use"}
# status -> Anthropic's error type (its API's own table); a 422 of ours is its 400
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               529: "overloaded_error"}


def event(name: str, payload: dict) -> bytes:
    return sse(payload, event=name)


def tool_input(call: ToolCall) -> dict:
    """A call's arguments as the `input` object (a call cut by max_tokens, whose JSON is unfinished: `{}`)."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(finish: Finish) -> list[dict]:
    blocks = [{"type": "text", "text": finish.text}] if finish.text or not finish.tool_calls else []
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c)} for c in finish.tool_calls]
    return blocks


def stop_sequence(finish: Finish) -> str | None:
    return finish.matched_stop if finish.reason == "stop_sequence" and isinstance(finish.matched_stop, str) else None


class AnthropicMessages(Dialect):
    name = "anthropic"

    def parse(self, payload: Any, route: str) -> Parsed:
        for key in unknown_fields(payload, MessagesBody, TOLERATED):
            raise ValidationFailed(f"{key}: Extra inputs are not permitted", param=key)
        body = convert(payload, MessagesBody)
        required(bool(body.model), "model")
        required(body.max_tokens is not None, "max_tokens")
        check(body.max_tokens >= 1, "max_tokens: must be at least 1", "max_tokens")
        messages = conversation(body)
        check(body.temperature is None or 0 <= body.temperature <= 1, "temperature: must be between 0 and 1",
              "temperature")
        check(body.top_p is None or 0 < body.top_p <= 1, "top_p: must be in (0, 1]", "top_p")
        check(body.top_k is None or body.top_k >= 0, "top_k: must be >= 0", "top_k")
        stops = list(body.stop_sequences or [])
        bounds.stops(stops, MAX_STOP_SEQUENCES, "stop_sequences")
        if not all(stops):
            fail("stop_sequences: each must be a non-empty string", "stop_sequences")
        params = SamplingParams(max_tokens=body.max_tokens, temperature=1.0 if body.temperature is None
                                else body.temperature, top_p=body.top_p or 1.0, top_k=body.top_k or 0, stop=stops)
        continued = prefill(messages)
        params.constraint = output_format(body)
        check(not (continued and params.constraint is not None),
              "output_config.format cannot be combined with a prefilled assistant message", "output_config.format")
        request = GenerateRequest(request_id="", model=body.model, messages=messages, params=params,
                                  stream=bool(body.stream), tools=tools(body), continue_final_message=continued)
        return Parsed(body.model, [request], bool(body.stream))

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> dict:
        (choice,) = results[0].ordered()
        done = results[0].done
        return {"id": f"msg_{meta.request_id}", "type": "message", "role": "assistant", "model": meta.model,
                "content": content_blocks(choice.finish), "stop_reason": STOP_REASONS[choice.finish.reason],
                "stop_sequence": stop_sequence(choice.finish),
                "usage": {"input_tokens": done.prompt_tokens if done else 0,
                          "output_tokens": done.completion_tokens if done else 0}}

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]], meta: Meta
                     ) -> AsyncIterator[bytes]:
        started = False
        block = -1  # the index of the open content block (-1: none)
        kind = None  # "text" | "tool_use": the open block's kind
        finish: Finish | None = None
        output_tokens = 0
        async for _, item in events:
            if not started:
                started = True
                prompt = item.prompt_tokens if isinstance(item, Accepted) else 0
                yield event("message_start", {"type": "message_start", "message": {
                    "id": f"msg_{meta.request_id}", "type": "message", "role": "assistant", "model": meta.model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": prompt, "output_tokens": 0}}})
                yield event("ping", {"type": "ping"})
            if isinstance(item, Token) and item.text:
                if kind != "text":
                    if kind is not None:
                        yield event("content_block_stop", {"type": "content_block_stop", "index": block})
                    block, kind = block + 1, "text"
                    yield event("content_block_start", {"type": "content_block_start", "index": block,
                                                        "content_block": {"type": "text", "text": ""}})
                yield event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                    "delta": {"type": "text_delta", "text": item.text}})
            elif isinstance(item, ToolCallDelta):
                if item.id is not None:  # a new call: its own block
                    if kind is not None:
                        yield event("content_block_stop", {"type": "content_block_stop", "index": block})
                    block, kind = block + 1, "tool_use"
                    yield event("content_block_start", {"type": "content_block_start", "index": block,
                                                        "content_block": {"type": "tool_use", "id": item.id,
                                                                          "name": item.name, "input": {}}})
                if item.arguments:
                    yield event("content_block_delta", {"type": "content_block_delta", "index": block,
                                                        "delta": {"type": "input_json_delta",
                                                                  "partial_json": item.arguments}})
            elif isinstance(item, Finish):
                finish = item
            elif isinstance(item, Done):
                output_tokens = item.completion_tokens
        if kind is not None:
            yield event("content_block_stop", {"type": "content_block_stop", "index": block})
        reason = STOP_REASONS[finish.reason] if finish is not None else "end_turn"
        yield event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": reason,
                                                "stop_sequence": stop_sequence(finish) if finish else None},
                                      "usage": {"output_tokens": output_tokens}})
        yield event("message_stop", {"type": "message_stop"})

    def reported(self, error: SluiceError) -> SluiceError:
        """A validation error is Anthropic's 400, a context overflow in its words; full workers are its 529
        `overloaded_error` (which its SDKs retry), not a rate limit of the caller's; a spent budget is its 402
        `billing_error`, as it answers credit run out (its SDKs never retry a 402; `x-should-retry: false` stays)."""
        if isinstance(error, Overloaded):
            return restated(error, 529)
        if isinstance(error, QuotaExceeded):
            return restated(error, 402)
        if error.status != 422:
            return error
        error = restated(error, 400)
        if error.param == "response_format":  # the worker's name of the structured-output field; Anthropic's
            message = error.message.replace("response_format", "output_config.format")  # messages start with it
            error.param = "output_config.format"
            error.message = message if message.startswith(error.param) else f"{error.param}: {message}"
        if isinstance(error, ContextTooLong) and error.max_context is not None and error.prompt_tokens is not None:
            error.message = (f"prompt is too long: {error.prompt_tokens} tokens > {error.max_context} maximum"
                             if error.max_tokens is None or error.prompt_tokens >= error.max_context else
                             f"input length and `max_tokens` exceed context limit: {error.prompt_tokens} + "
                             f"{error.max_tokens} > {error.max_context}, decrease input length or `max_tokens` "
                             "and try again")
        return error

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        error = self.reported(error)
        kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
        return error.status, {"type": "error", "error": {"type": kind, "message": error.message}}

    def stream_error(self, error: SluiceError) -> bytes:
        return event("error", self.error_body(error)[1])


MESSAGES = AnthropicMessages()
