"""OpenAI's Responses API on the shared engine: one chat GenerateRequest per response; the reply is a `response`
object (`output` items: a `message` with `output_text`, and `function_call`s), streamed as OpenAI's event
sequence: `response.created`, `response.in_progress`, per item `response.output_item.added`, its content
(`response.content_part.added`, `response.output_text.delta`s, `response.output_text.done`,
`response.content_part.done`, or `response.function_call_arguments.delta`s and `.done`),
`response.output_item.done`, then `response.completed` (`response.incomplete` when cut by
`max_output_tokens`). Every event carries its `sequence_number`.

A dialect object serves one request: it carries the conversation it continues and what to store when done."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from common.protocol import Done, Event, Finish, GenerateRequest, SamplingParams, Token, ToolCall, ToolCallDelta
from gateway.dialects import bounds
from gateway.dialects.openai.chat import chat_logprobs
from gateway.dialects.openai.errors import chat_wording
from gateway.dialects.openai.family import OpenAIFamily
from gateway.dialects.openai.prediction import prediction_text
from gateway.dialects.responses.request import (
    TOLERATED,
    ResponsesBody,
    input_turns,
    logprobs,
    max_tool_calls,
    stream_options,
    text_format,
    tools,
)
from gateway.dialects.responses.store import NOT_STORED
from gateway.errors import SluiceError, UnknownParameter
from gateway.serving.collect import Result
from gateway.serving.dialect import Meta, Parsed, check, convert, required, sse

log = structlog.get_logger("gateway")


@dataclass
class Echo:
    """What the response object repeats of the request, and the conversation to store."""

    body: ResponsesBody
    format: dict
    turns: list[dict]  # the conversation so far, this request's input included (no instructions)
    logprobs: bool = False  # include: message.output_text.logprobs
    max_calls: int | None = None  # max_tool_calls: the calls past it are dropped
    predicted: bool = False  # usage carries the prediction's accepted and rejected tokens


def token_logprobs(tokens: list[Token]) -> list[dict]:
    """Responses' `output_text.logprobs`: chat's entries ({token, logprob, bytes, top_logprobs})."""
    return chat_logprobs([t for t in tokens if t.text or t.piece])["content"]


def output_items(finish: Finish, request_id: str, status: str, logprobs: list[dict] | None = None) -> list[dict]:
    items = []
    if finish.text or not finish.tool_calls:
        items.append({"type": "message", "id": f"msg_{request_id}", "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": finish.text, "annotations": [],
                                   "logprobs": logprobs or []}]})
    items += [function_item(call, status) for call in finish.tool_calls]
    return items


def function_item(call: ToolCall, status: str) -> dict:
    return {"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def assistant_turn(finish: Finish) -> dict:
    """The answer as the next request's history holds it."""
    if not finish.tool_calls:
        return {"role": "assistant", "content": finish.text}
    return {"role": "assistant", "content": finish.text or None,
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in finish.tool_calls]}


def input_wording(context: int, prompt: int, completion: int | None) -> str:
    """OpenAI's context-overflow message, about the input rather than messages."""
    return chat_wording(context, prompt, completion).replace("messages", "input")


class OpenAIResponses(OpenAIFamily):
    """`history`: the turns of the stored response named by `previous_response_id`; `save`: stores a finished
    response with its conversation (None: `store` is false). A collected answer leaves it in `pending` for the
    route to store (rendering cannot wait); a stream stores it before its last event."""

    name = "responses"  # the ledger's dialect: the Responses API, not Chat Completions
    renders_elsewhere = False  # `render` keeps the response it made, for `store_pending`
    prompt_param = "input"
    context_wording = staticmethod(input_wording)

    def __init__(self, history: list[dict] | None = None,
                 save: Callable[[dict, list[dict]], Awaitable[None]] | None = None):
        super().__init__()
        self.history = history or []
        self.save = save
        self.pending: tuple[dict, list[dict]] | None = None

    def parse(self, payload: Any, route: str) -> Parsed:
        self.refuse_unknown(payload, ResponsesBody)
        body = convert(payload, ResponsesBody)
        required(bool(body.model), "model")
        bounds.metadata(body.metadata)
        turns = self.history + input_turns(body.input)
        messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + turns
        check(body.max_output_tokens is None or body.max_output_tokens >= 1, "max_output_tokens must be at least 1",
              "max_output_tokens")
        check(body.temperature is None or 0 <= body.temperature <= 2, "temperature must be between 0 and 2",
              "temperature")
        check(body.top_p is None or 0 < body.top_p <= 1, "top_p must be in (0, 1]", "top_p")
        chosen, constrained = text_format(body.text)
        stream_options(body)
        top = logprobs(body)
        params = SamplingParams(max_tokens=body.max_output_tokens,
                                temperature=1.0 if body.temperature is None else body.temperature,
                                top_p=body.top_p or 1.0, constraint=constrained, logprobs=top)
        request = GenerateRequest(request_id="", model=body.model, messages=messages, params=params,
                                  stream=bool(body.stream), tools=tools(body, body.model),
                                  prediction=prediction_text(body.prediction))
        return Parsed(body.model, [request], bool(body.stream),
                      Echo(body, chosen, turns, top is not None, max_tool_calls(body), request.prediction is not None))

    def reported(self, error: SluiceError) -> SluiceError:
        """As the other OpenAI routes, but the worker's structured-output field is this API's `text.format`."""
        error = super().reported(error)
        if error.param == "response_format":
            error = copy.copy(error)
            error.param, error.message = "text.format", error.message.replace("response_format", "text.format")
        return error

    def refuse_unknown(self, payload: Any, kind: type[msgspec.Struct]) -> None:
        if isinstance(payload, dict):
            for name, value in payload.items():
                if value is not None and name not in kind.__struct_fields__ and name not in TOLERATED:
                    raise UnknownParameter(name)

    def response(self, parsed: Parsed, meta: Meta, status: str, output: list[dict], done: Done | None) -> dict:
        echo: Echo = parsed.options
        body = echo.body
        details = {"reasoning_tokens": 0}
        if echo.predicted and done is not None:  # as chat's completion_tokens_details: the rejected ones are billed
            details |= {"accepted_prediction_tokens": done.accepted_prediction_tokens,
                        "rejected_prediction_tokens": done.rejected_prediction_tokens}
        usage = None if done is None else {
            "input_tokens": done.prompt_tokens, "input_tokens_details": {"cached_tokens": done.cached_tokens},
            "output_tokens": done.completion_tokens, "output_tokens_details": details,
            "total_tokens": done.prompt_tokens + done.completion_tokens}
        return {"id": f"resp_{meta.request_id}", "object": "response", "created_at": meta.created, "status": status,
                "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": meta.model,
                "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": body.previous_response_id,
                "temperature": 1.0 if body.temperature is None else body.temperature,
                "top_p": body.top_p or 1.0, "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
                "text": {"format": echo.format}, "truncation": "disabled", "store": body.store is not False,
                "metadata": body.metadata or {}, "reasoning": {"effort": None, "summary": None}, "user": None,
                "top_logprobs": body.top_logprobs or 0, "max_tool_calls": body.max_tool_calls, "usage": usage}

    def finished(self, parsed: Parsed, meta: Meta, finish: Finish, done: Done | None,
                 tokens: list[Token] | None = None) -> dict:
        echo: Echo = parsed.options
        if echo.max_calls is not None and len(finish.tool_calls) > echo.max_calls:
            finish = msgspec.structs.replace(finish, tool_calls=finish.tool_calls[:echo.max_calls])
        status = "incomplete" if finish.reason == "length" else "completed"
        logprobs = token_logprobs(tokens or []) if echo.logprobs else None
        response = self.response(parsed, meta, status, output_items(finish, meta.request_id, status, logprobs), done)
        self.pending = (response, [*echo.turns, assistant_turn(finish)])
        return response

    async def store_pending(self) -> dict | None:
        """Store the finished response. One that no longer fits (its output took it past the bound, or the team's
        quota filled while it ran) is answered unstored: its object then says `store: false`, and is returned
        for the caller to send so."""
        pending, self.pending = self.pending, None
        if pending is None or self.save is None:
            return None
        try:
            await self.save(*pending)
        except NOT_STORED as refused:
            log.warning("responses.not_stored", code=refused.code, response_id=pending[0]["id"])
            pending[0]["store"] = False
            return pending[0]
        return None

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> dict:
        (choice,) = results[0].ordered()
        return self.finished(parsed, meta, choice.finish, results[0].done, choice.tokens)

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]], meta: Meta
                     ) -> AsyncIterator[bytes]:
        """Each output item opens, streams its content and closes before the next one opens (OpenAI's order: the
        SDKs' stream accumulators index the items by `output_index`)."""
        echo: Echo = parsed.options
        number = 0

        def event(name: str, **fields) -> bytes:
            nonlocal number
            number += 1
            return sse({"type": name, "sequence_number": number - 1, **fields}, event=name)

        started = self.response(parsed, meta, "in_progress", [], None)
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        message_id = f"msg_{meta.request_id}"
        items = 0  # output items opened so far; the open one is the last
        open_kind: str | None = None  # "message" | "function_call": the item open now
        text, call = "", {}
        tokens: list[Token] = []
        finish: Finish | None = None
        done: Done | None = None

        def part(value: str, logprobs: list[dict]) -> dict:
            return {"type": "output_text", "text": value, "annotations": [], "logprobs": logprobs}

        def close() -> list[bytes]:
            index = items - 1
            if open_kind == "message":
                logprobs = token_logprobs(tokens) if echo.logprobs else []
                item = {"type": "message", "id": message_id, "status": "completed", "role": "assistant",
                        "content": [part(text, logprobs)]}
                return [event("response.output_text.done", item_id=message_id, output_index=index, content_index=0,
                              text=text, logprobs=logprobs),
                        event("response.content_part.done", item_id=message_id, output_index=index,
                              content_index=0, part=part(text, logprobs)),
                        event("response.output_item.done", output_index=index, item=item)]
            if open_kind == "function_call":
                return [event("response.function_call_arguments.done", item_id=call["id"], output_index=index,
                              arguments=call["arguments"]),
                        event("response.output_item.done", output_index=index, item={**call, "status": "completed"})]
            return []

        async for _, item in events:
            if isinstance(item, Token):
                tokens.append(item)
                if not item.text:
                    continue
                if open_kind != "message":
                    for chunk in close():
                        yield chunk
                    open_kind, items = "message", items + 1
                    yield event("response.output_item.added", output_index=items - 1, item={
                        "type": "message", "id": message_id, "status": "in_progress", "role": "assistant",
                        "content": []})
                    yield event("response.content_part.added", item_id=message_id, output_index=items - 1,
                                content_index=0, part=part("", []))
                text += item.text
                yield event("response.output_text.delta", item_id=message_id, output_index=items - 1,
                            content_index=0, delta=item.text,
                            logprobs=token_logprobs([item]) if echo.logprobs else [])
            elif isinstance(item, ToolCallDelta):
                if echo.max_calls is not None and item.call >= echo.max_calls:
                    continue  # past max_tool_calls: ignored, as OpenAI ignores further calls
                if item.id is not None:
                    for chunk in close():
                        yield chunk
                    open_kind, items = "function_call", items + 1
                    call = {"type": "function_call", "id": f"fc_{item.id}", "call_id": item.id, "name": item.name,
                            "arguments": "", "status": "in_progress"}
                    yield event("response.output_item.added", output_index=items - 1, item=call)
                if item.arguments:
                    call["arguments"] += item.arguments
                    yield event("response.function_call_arguments.delta", item_id=call["id"],
                                output_index=items - 1, delta=item.arguments)
            elif isinstance(item, Finish):
                finish = item
            elif isinstance(item, Done):
                done = item
        for chunk in close():
            yield chunk
        if finish is None:
            return
        response = self.finished(parsed, meta, finish, done, tokens)
        await self.store_pending()
        name = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield event(name, response=response)
