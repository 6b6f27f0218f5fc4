"""OpenAI `POST /v1/completions`: request fields, defaults, validation and the response/stream shapes.

The non-streamed shape is the superset every OpenAI and Friendli client accepts:
`id, object, created, model, choices[{index, text, seed, tokens, finish_reason, logprobs}], usage`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from gateway.collect import Choice, Result
from gateway.dialects.base import Dialect, Meta, Parsed, check, convert, sse
from worker.protocol import Accepted, Done, Event, Finish, GenerateRequest, SamplingParams, Token

FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop", "stop_token": "stop",
          "cancelled": "stop", "error": "stop"}
MAX_STOPS = 4
MAX_LOGPROBS = 20


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class CompletionBody(msgspec.Struct, kw_only=True):
    """Explicit JSON null means "unset" for every optional field."""

    model: str
    prompt: str | list | None = None  # str, list[str], list[int] or list[list[int]]: see split_prompts
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    best_of: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | list[int] | None = None
    logprobs: int | None = None
    echo: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    suffix: str | None = None


@dataclass
class Options:
    echo: bool
    include_usage: bool
    logprobs: int | None
    n: int


def split_prompts(prompt) -> list[tuple[str | None, list[int] | None]]:
    """A string, a list of strings, a token list or a list of token lists -> (text, ids) per prompt."""
    check(prompt is not None, "prompt is required", "prompt")
    if isinstance(prompt, str):
        return [(prompt, None)]
    check(len(prompt) > 0, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [(None, list(prompt))]
    if all(isinstance(p, str) for p in prompt):
        return [(p, None) for p in prompt]
    check(all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
              for p in prompt),
          "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists", "prompt")
    return [(None, list(p)) for p in prompt]


def stop_list(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    check(len(stops) <= MAX_STOPS, f"stop may hold at most {MAX_STOPS} sequences", "stop")
    check(all(stops), "stop sequences must not be empty", "stop")
    return stops


def logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    result = {}
    for key, value in (bias or {}).items():
        check(key.lstrip("-").isdigit(), f"logit_bias key {key!r} is not a token id", "logit_bias")
        check(-100 <= value <= 100, "logit_bias values must be between -100 and 100", "logit_bias")
        result[int(key)] = value
    return result


def seeds(seed: int | list[int] | None) -> list[int] | None:
    if seed is None:
        return None
    values = [seed] if isinstance(seed, int) else list(seed)
    check(all(0 <= s < 2**63 for s in values), "seed must be a non-negative 63-bit integer", "seed")
    return values


class OpenAICompletions(Dialect):
    name = "openai"
    default_max_tokens: int | None = 16

    def parse(self, payload, route: str) -> Parsed:
        body = convert(payload, CompletionBody)
        n = body.n if body.n is not None else 1
        check(1 <= n <= 128, "n must be between 1 and 128", "n")
        best_of = body.best_of if body.best_of is not None else n
        check(best_of >= n, "best_of must be greater than or equal to n", "best_of")
        check(best_of <= 128, "best_of must be at most 128", "best_of")
        stream = bool(body.stream)
        check(not (stream and best_of > n), "best_of > n cannot be streamed", "best_of")
        max_tokens = body.max_tokens if body.max_tokens is not None else self.default_max_tokens
        check(max_tokens is None or max_tokens >= 1, "max_tokens must be at least 1", "max_tokens")
        temperature = body.temperature if body.temperature is not None else 1.0
        check(0 <= temperature <= 2, "temperature must be between 0 and 2", "temperature")
        top_p = body.top_p if body.top_p is not None else 1.0
        check(0 < top_p <= 1, "top_p must be in (0, 1]", "top_p")
        for field in ("presence_penalty", "frequency_penalty"):
            value = getattr(body, field)
            check(value is None or -2 <= value <= 2, f"{field} must be between -2 and 2", field)
        check(body.logprobs is None or 0 <= body.logprobs <= MAX_LOGPROBS,
              f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
        check(body.suffix is None, "suffix is not supported by this model", "suffix")
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, n=n,
            best_of=best_of if best_of != n else None, stop=stop_list(body.stop), seed=seeds(body.seed),
            logprobs=body.logprobs, presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0, logit_bias=logit_bias(body.logit_bias))
        echo = bool(body.echo)
        requests = [GenerateRequest(request_id="", model=body.model, prompt=text, prompt_ids=ids, params=params,
                                    return_prompt_text=echo)
                    for text, ids in split_prompts(body.prompt)]
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Parsed(body.model, requests, stream, Options(echo, include_usage, body.logprobs, n),
                      reserve_tokens=len(requests) * best_of * (max_tokens or 0))

    # ---- rendering ----

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> dict:
        options: Options = parsed.options
        choices = []
        for prompt_index, result in enumerate(results):
            for choice in result.ordered():
                choices.append(self._choice(prompt_index * options.n + choice.finish.index, choice,
                                            result.accepted, options))
        return {"id": f"cmpl-{meta.request_id}", "object": "text_completion", "created": meta.created,
                "model": meta.model, "choices": choices, "usage": usage(results)}

    def _choice(self, index: int, choice: Choice, accepted: Accepted, options: Options) -> dict:
        finish = choice.finish
        prefix = accepted.prompt_text if options.echo and accepted.prompt_text else ""
        return {"index": index, "text": prefix + finish.text, "seed": finish.seed, "tokens": finish.token_ids,
                "finish_reason": FINISH[finish.reason],
                "logprobs": completion_logprobs(choice.tokens, len(prefix)) if options.logprobs is not None else None}

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]], meta: Meta) -> AsyncIterator[bytes]:
        options: Options = parsed.options
        head = {"id": f"cmpl-{meta.request_id}", "object": "text_completion", "created": meta.created,
                "model": meta.model}
        dones: list[Done] = []
        async for prompt_index, event in events:
            base = prompt_index * options.n
            if isinstance(event, Accepted) and options.echo and event.prompt_text:
                for i in range(options.n):
                    yield sse({**head, "choices": [{"index": base + i, "text": event.prompt_text,
                                                    "finish_reason": None, "logprobs": None}]})
            elif isinstance(event, Token):
                choice = {"index": base + event.index, "text": event.text, "token": event.token_id,
                          "finish_reason": None, "logprobs": None}
                if options.logprobs is not None:
                    choice["logprobs"] = completion_logprobs([event], 0)
                yield sse({**head, "choices": [choice]})
            elif isinstance(event, Finish):
                yield sse({**head, "choices": [{"index": base + event.index, "text": "",
                                                "finish_reason": FINISH[event.reason], "logprobs": None}]})
            elif isinstance(event, Done):
                dones.append(event)
        if options.include_usage:
            yield sse({**head, "choices": [], "usage": usage_of(dones)})
        yield b"data: [DONE]\n\n"


def completion_logprobs(tokens: list[Token], offset: int) -> dict:
    """OpenAI completions layout: parallel arrays over the generated tokens."""
    pieces, logprobs, tops, offsets = [], [], [], []
    position = offset
    for token in tokens:
        piece = token.piece if token.piece is not None else token.text
        pieces.append(piece)
        logprobs.append(token.logprob)
        tops.append({top.text: top.logprob for top in token.top_logprobs} if token.top_logprobs else None)
        offsets.append(position)
        position += len(piece)
    return {"tokens": pieces, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def usage_of(dones: list[Done]) -> dict:
    prompt = sum(d.prompt_tokens for d in dones)
    completion = sum(d.completion_tokens for d in dones)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def usage(results: list[Result]) -> dict:
    return usage_of([r.done for r in results if r.done is not None])
