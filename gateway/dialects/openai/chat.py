"""OpenAI `POST /v1/chat/completions` (Friendli chat fields as extensions), also Friendli's chat routes.

`messages` go to the worker, which applies the model's chat template. Replies always carry
`id, object, created, model, system_fingerprint, usage, choices[{index, message{role, content},
finish_reason, logprobs}]` (the strictest clients, Speakeasy and text-generation, need all of them).
Streams: a role delta per choice first, content deltas, an empty-delta finish chunk per choice, the
usage chunk when `stream_options.include_usage`, then `[DONE]`. Tool calling: `tools.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from common.protocol import Done, Event, Finish, GenerateRequest, Token, ToolCallDelta
from gateway.dialects import bounds
from gateway.dialects.chat_template import final_text, template_kwargs
from gateway.dialects.openai.completions import FINISH, stream_end, usage
from gateway.dialects.openai.family import OpenAIFamily
from gateway.dialects.openai.prediction import prediction_text
from gateway.dialects.openai.request import OpenAIRequest, deadline, sampling_params
from gateway.dialects.openai.tools import delta_call, history_calls, message_calls, tool_spec
from gateway.errors import ValidationFailed
from gateway.serving.collect import Result
from gateway.serving.dialect import Meta, Parsed, check, convert, fail, incomplete, required, sse

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOP_LOGPROBS = 20
FINGERPRINT = "fp_sluice"


class ChatBody(OpenAIRequest, kw_only=True):
    messages: list | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    tool_prompt: str | None = None  # TGI: the text that introduces the tools (templates without a tools slot)
    functions: list | None = None
    function_call: str | dict | None = None
    chat_template_kwargs: dict | None = None  # vLLM, SGLang: extra chat template variables (chat_template.py)
    # vLLM: continue the final assistant message (a prefill) instead of starting a new turn; add_generation_prompt
    # false renders no assistant header at all
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    prediction: dict | None = None  # OpenAI's Predicted Outputs (prediction.py)


@dataclass
class ChatOptions:
    include_usage: bool
    logprobs: bool
    n: int
    # `incomplete: true` on a choice cut before its response_format grammar accepted; a tool call cut by
    # max_tokens is said by finish_reason "length" alone, as OpenAI says it (its clients read nothing else)
    flags_incomplete: bool = True
    predicted: bool = False  # usage carries completion_tokens_details (Predicted Outputs)

    def incomplete(self, finish: Finish) -> dict:
        return incomplete(finish) if self.flags_incomplete else {}


def text_of(content, index: int) -> str:
    """Message content: a string, null, or a list of `{"type": "text", "text": ...}` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        fail(f"messages[{index}].content must be a string or a list of parts", "messages")
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            fail(f"messages[{index}]: only text content parts are supported by this model", "messages")
        texts.append(part["text"])
    return "".join(texts)


def normalise_messages(messages) -> list[dict]:
    required(messages is not None, "messages")
    check(isinstance(messages, list) and len(messages) > 0, "messages must be a non-empty list", "messages")
    bounds.at_most(messages, bounds.MAX_MESSAGES, "messages", "messages")
    result = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            fail(f"messages[{index}] must be an object", "messages")
        role = message.get("role")
        if role not in ROLES:
            fail(f"messages[{index}].role must be one of {', '.join(ROLES)}", "messages")
        turn = {"role": "system" if role == "developer" else role, "content": text_of(message.get("content"), index)}
        if message.get("tool_calls") is not None:
            if role != "assistant":
                fail(f"messages[{index}]: only assistant turns carry tool_calls", "messages")
            turn["tool_calls"] = history_calls(message["tool_calls"], index)
            if message.get("content") is None:
                turn["content"] = None
        if role == "tool":
            call_id = message.get("tool_call_id")
            check(isinstance(call_id, str) and call_id != "",
                  f"messages[{index}]: a tool turn needs tool_call_id (the id of the call it answers)", "messages")
            turn["tool_call_id"] = call_id
        result.append(turn)
    return result


def refuse_unsupported(body: ChatBody) -> None:
    if body.functions is not None or body.function_call is not None:
        raise ValidationFailed("functions and function_call are deprecated and not supported: use tools and "
                               "tool_choice", param="functions", code="functions_not_supported")


def continuation(body: ChatBody, messages: list[dict]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message) as vLLM reads them: both set true is an error, and a
    continued message must be the final assistant text."""
    check(not (body.continue_final_message and body.add_generation_prompt),
          "continue_final_message and add_generation_prompt cannot both be true", "continue_final_message")
    if not body.continue_final_message:
        return body.add_generation_prompt is not False, False
    text = final_text(messages)
    check(text is not None and text.strip() != "",
          "continue_final_message needs a final assistant message with text (and no tool calls)",
          "continue_final_message")
    return False, True


class OpenAIChat(OpenAIFamily):

    def parse(self, payload, route: str) -> Parsed:
        self.refuse_unknown(payload, ChatBody)
        body = convert(payload, ChatBody)
        required(bool(body.model), "model")
        messages = normalise_messages(body.messages)
        refuse_unsupported(body)
        tools = tool_spec(body.tools, body.tool_choice, body.parallel_tool_calls, body.tool_prompt)
        check(body.max_tokens is None or body.max_completion_tokens is None,
              "max_tokens and max_completion_tokens are mutually exclusive", "max_completion_tokens")
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        top = body.top_logprobs
        if not (top is None or 0 <= top <= MAX_TOP_LOGPROBS):
            fail(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")
        check(top is None or top == 0 or body.logprobs, "top_logprobs needs logprobs: true", "top_logprobs")
        logprobs = (top or 0) if body.logprobs else None
        params = sampling_params(body, default_max_tokens=None, max_temperature=None if self.friendli else 2.0,
                                 logprobs=logprobs)
        add_prompt, continue_final = continuation(body, messages)
        request = GenerateRequest(request_id="", model=body.model, messages=messages, params=params,
                                  deadline_unix=deadline(body.timeout_microseconds), stream=bool(body.stream),
                                  tools=tools, add_generation_prompt=add_prompt, continue_final_message=continue_final,
                                  chat_template_kwargs=template_kwargs(body.chat_template_kwargs),
                                  prediction=prediction_text(body.prediction))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Parsed(body.model, [request], bool(body.stream),
                      ChatOptions(include_usage, logprobs is not None, params.n, params.constraint is not None,
                                  predicted=request.prediction is not None))

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> dict:
        options: ChatOptions = parsed.options
        choices = [{"index": c.finish.index, "message": chat_message(c.finish),
                    "finish_reason": FINISH[c.finish.reason],
                    "logprobs": chat_logprobs(c.tokens) if options.logprobs else None, **options.incomplete(c.finish)}
                   for c in results[0].ordered()]
        return {"id": f"chatcmpl-{meta.request_id}", "object": "chat.completion", "created": meta.created,
                "model": meta.model, "system_fingerprint": FINGERPRINT, "choices": choices,
                "usage": usage(results, predicted=options.predicted)}

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]],
                     meta: Meta) -> AsyncIterator[bytes]:
        options: ChatOptions = parsed.options
        head = {"id": f"chatcmpl-{meta.request_id}", "object": "chat.completion.chunk", "created": meta.created,
                "model": meta.model, "system_fingerprint": FINGERPRINT}
        for index in range(options.n):
            yield sse({**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                            "finish_reason": None, "logprobs": None}]})
        dones: list[Done] = []
        async for _, event in events:
            if isinstance(event, Token):
                if not event.text and not options.logprobs:
                    continue  # a token whose text is still incomplete UTF-8: nothing to show yet
                yield sse({**head, "choices": [{"index": event.index, "delta": {"content": event.text},
                                                "finish_reason": None,
                                                "logprobs": chat_logprobs([event]) if options.logprobs else None}]})
            elif isinstance(event, ToolCallDelta):
                yield sse({**head, "choices": [{"index": event.index, "delta": {"tool_calls": [delta_call(event)]},
                                                "finish_reason": None, "logprobs": None}]})
            elif isinstance(event, Finish):
                yield sse({**head, "choices": [{"index": event.index, "delta": {},
                                                "finish_reason": FINISH[event.reason], "logprobs": None,
                                                **options.incomplete(event)}]})
            elif isinstance(event, Done):
                dones.append(event)
        for chunk in stream_end(head, dones, options.include_usage, options.predicted):
            yield chunk


def chat_message(finish: Finish) -> dict:
    if not finish.tool_calls:
        return {"role": "assistant", "content": finish.text}
    return {"role": "assistant", "content": finish.text or None, "tool_calls": message_calls(finish.tool_calls)}


def chat_logprobs(tokens: list[Token]) -> dict:
    """OpenAI chat layout: `content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]`.

    The same few texts recur among every token's alternatives: each text's byte list is made once and shared (only
    encoded, never changed). `n` = 32 with 20 alternatives is 100,000 entries, and this halves their cost."""
    byte_lists: dict[str, list[int]] = {}

    def entry(text: str, logprob: float | None) -> dict:
        codes = byte_lists.get(text)
        if codes is None:
            codes = byte_lists[text] = list(text.encode())
        return {"token": text, "logprob": logprob, "bytes": codes}

    content = []
    for token in tokens:
        chosen = entry(token.piece if token.piece is not None else token.text, token.logprob)
        chosen["top_logprobs"] = [entry(t.text, t.logprob) for t in token.top_logprobs or ()]
        content.append(chosen)
    return {"content": content, "refusal": None}
