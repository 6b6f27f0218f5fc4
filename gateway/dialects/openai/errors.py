"""OpenAI's error contract: a request it refuses as invalid is a 400 `invalid_request_error` naming `param` (never
FastAPI's 422: the openai SDK raises `BadRequestError` for it), and a prompt over the model's context is
`context_length_exceeded` in OpenAI's own words, which client frameworks match to trim the history or fall back
to a longer-context model."""

from __future__ import annotations

import copy
from collections.abc import Callable

from gateway.errors import ContextTooLong, SluiceError

Wording = Callable[[int, int, int | None], str]  # (context, prompt tokens, completion tokens or None) -> message


def chat_wording(context: int, prompt: int, completion: int | None) -> str:
    if completion is None:
        return (f"This model's maximum context length is {context} tokens. However, your messages resulted in "
                f"{prompt} tokens. Please reduce the length of the messages.")
    return (f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the completion). Please reduce "
            "the length of the messages or completion.")


def completions_wording(context: int, prompt: int, completion: int | None) -> str:
    completion = completion or 0
    return (f"This model's maximum context length is {context} tokens, however you requested {prompt + completion} "
            f"tokens ({prompt} in your prompt; {completion} for the completion). Please reduce your prompt; or "
            "completion length.")


def as_openai(error: SluiceError, wording: Wording, prompt_param: str | None) -> SluiceError:
    """`error` as OpenAI reports it (a copy; it may run twice: the result is unchanged by a second pass).
    `prompt_param`: the param of a context overflow (chat: "messages"; None keeps the worker's field)."""
    overflow = isinstance(error, ContextTooLong) and error.max_context is not None and error.prompt_tokens is not None
    if not overflow and error.status != 422:
        return error
    error = copy.copy(error)
    if overflow:
        error.message = wording(error.max_context, error.prompt_tokens, error.max_tokens)
        error.param = prompt_param or error.param
    error.status = 400
    return error
