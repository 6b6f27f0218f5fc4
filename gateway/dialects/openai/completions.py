"""OpenAI `POST /v1/completions` (with Friendli's fields as extensions) and the Friendli completions routes.

The non-streamed shape is the superset every OpenAI and Friendli client accepts:
`id, object, created, model, choices[{index, text, seed, tokens, finish_reason, logprobs}], usage`.
Streams are OpenAI chunks (which carry Friendli's `token` too), or Friendli's legacy
`token_sampled`/`complete` events for friendli-client <= 1.5 (see `dialects.friendli.legacy`).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from common.protocol import Accepted, Done, Event, Finish, GenerateRequest, PromptToken, Token
from gateway.dialects import bounds
from gateway.dialects.openai.errors import completions_wording
from gateway.dialects.openai.family import OpenAIFamily
from gateway.dialects.openai.friendli_legacy import is_legacy, legacy_stream
from gateway.dialects.openai.prediction import prediction_text
from gateway.dialects.openai.request import OpenAIRequest, deadline, sampling_params
from gateway.dialects.token_ids import int_list, int_lists
from gateway.serving.collect import Choice, Result
from gateway.serving.dialect import SSE_DONE, Meta, Parsed, check, convert, fail, incomplete, required, sse
from gateway.serving.model_aliases import DEFAULT_MODEL

# a failed choice ("error", "cancelled") never reaches rendering: gateway.serving.answer.honest fails the request
FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop", "stop_token": "stop",
          "tool_calls": "tool_calls"}
MAX_LOGPROBS = 20


class CompletionBody(OpenAIRequest, kw_only=True):
    """Explicit JSON null means "unset" for every optional field."""

    prompt: str | list | None = None  # str, list[str], list[int] or list[list[int]]: see split_prompts
    tokens: list[int] | None = None  # Friendli: a pre-tokenized prompt
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    # friendli-client 1.5 sends these gRPC-only extras as null; a value is refused, never ignored
    soft_prompts: list | None = None
    position_ids: list | None = None
    generation_offset: int | None = None
    prediction: dict | None = None  # OpenAI's Predicted Outputs (prediction.py)


@dataclass
class Options:
    echo: bool
    include_usage: bool
    logprobs: int | None
    n: int
    legacy: bool = False
    predicted: bool = False  # usage carries completion_tokens_details (Predicted Outputs)


def split_prompts(prompt) -> list[tuple[str | None, list[int] | None]]:
    """A string, a list of strings, a token list or a list of token lists -> (text, ids) per prompt."""
    required(prompt is not None, "prompt")
    if isinstance(prompt, str):
        return [(prompt, None)]
    check(len(prompt) > 0, "prompt must not be empty", "prompt")
    if all(isinstance(p, str) for p in prompt):
        return [(p, None) for p in prompt]
    ids = int_list(prompt) if not isinstance(prompt[0], list) else None
    if ids is not None:
        return [(None, ids)]
    lists = int_lists(prompt)
    check(lists is not None,
          "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists", "prompt")
    return [(None, p) for p in lists]


class OpenAICompletions(OpenAIFamily):
    """`friendli=True` for /serverless and /dedicated: no 16-token default, no upper temperature bound."""

    context_wording = staticmethod(completions_wording)
    prompt_param = None  # a context overflow names the worker's field: prompt, or max_tokens

    def __init__(self, *, friendli: bool = False, legacy_header: bool = False):
        super().__init__(friendli=friendli)
        self.legacy_header = legacy_header  # the route saw `X-API-Dialect: friendli-legacy`

    def parse(self, payload, route: str) -> Parsed:
        self.refuse_unknown(payload, CompletionBody)
        body = convert(payload, CompletionBody)
        legacy = self.legacy_header or is_legacy(payload, None)
        # friendli-client 1.5 in container style names no model: it gets the default one (Friendli's
        # container semantics); every other caller of this OpenAI route must name one, as with OpenAI
        required(bool(body.model) or (legacy and not self.friendli), "model")
        model = body.model or DEFAULT_MODEL
        for field in ("soft_prompts", "position_ids", "generation_offset"):
            if getattr(body, field) is not None:
                fail(f"{field} is a gRPC-only field this server does not support", field)
        check(body.suffix is None, "suffix is not supported by this model", "suffix")
        check(body.logprobs is None or 0 <= body.logprobs <= MAX_LOGPROBS,
              f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
        check(body.prompt is None or body.tokens is None, "give either prompt or tokens, not both", "tokens")
        if body.tokens is not None:
            check(len(body.tokens) > 0 and min(body.tokens) >= 0, "tokens must be a non-empty list of token ids",
                  "tokens")
            prompts = [(None, list(body.tokens))]
        else:
            prompts = split_prompts(body.prompt)
        params = sampling_params(body, default_max_tokens=None if self.friendli else 16,
                                 max_temperature=None if self.friendli else 2.0, logprobs=body.logprobs,
                                 score_only=bool(body.echo))
        bounds.prompts(len(prompts), max(params.best_of or params.n, params.num_beams), "prompt")
        echo = bool(body.echo)
        # OpenAI's echo with logprobs scores the prompt too (how evaluation harnesses compute likelihoods)
        params.prompt_logprobs = echo and params.logprobs is not None
        until = deadline(body.timeout_microseconds)
        predicted = prediction_text(body.prediction)
        requests = [GenerateRequest(request_id="", model=model, prompt=text, prompt_ids=ids, params=params,
                                    prediction=predicted,
                                    return_prompt_text=echo, deadline_unix=until, stream=bool(body.stream),
                                    token_index_to_replace=list(body.token_index_to_replace or []),
                                    embedding_to_replace=list(body.embedding_to_replace or []))
                    for text, ids in prompts]
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Parsed(model, requests, bool(body.stream),
                      Options(echo, include_usage, params.logprobs, params.n, legacy, predicted is not None))

    # ---- rendering ----

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> dict:
        options: Options = parsed.options
        choices = []
        for prompt_index, result in enumerate(results):
            for choice in result.ordered():
                choices.append(self._choice(prompt_index * options.n + choice.finish.index, choice,
                                            result.accepted, options))
        return {"id": f"cmpl-{meta.request_id}", "object": "text_completion", "created": meta.created,
                "model": meta.model, "choices": choices,
                "usage": usage(results, predicted=options.predicted)}

    def _choice(self, index: int, choice: Choice, accepted: Accepted, options: Options) -> dict:
        finish = choice.finish
        prefix = accepted.prompt_text if options.echo and accepted.prompt_text else ""
        logprobs = None
        if options.logprobs is not None:
            logprobs = completion_logprobs(choice.tokens, len(prefix))
            if options.echo:
                logprobs = joined(prompt_logprobs(accepted.prompt_details or []), logprobs)
        body = {"index": index, "text": prefix + finish.text, "seed": finish.seed, "tokens": finish.token_ids,
                "finish_reason": FINISH[finish.reason], "logprobs": logprobs, **incomplete(finish)}
        if any(t.logits is not None for t in choice.tokens):  # Friendli include_output_logits
            body["logits"] = [t.logits for t in choice.tokens]
        return body

    def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]], meta: Meta) -> AsyncIterator[bytes]:
        options: Options = parsed.options
        if options.legacy:
            return legacy_stream(events, options.n, options.logprobs is not None)
        return self._chunks(options, events, meta)

    async def _chunks(self, options: Options, events, meta: Meta) -> AsyncIterator[bytes]:
        head = {"id": f"cmpl-{meta.request_id}", "object": "text_completion", "created": meta.created,
                "model": meta.model}
        dones: list[Done] = []
        async for prompt_index, event in events:
            base = prompt_index * options.n
            if isinstance(event, Accepted) and options.echo and event.prompt_text:
                logprobs = None if options.logprobs is None else prompt_logprobs(event.prompt_details or [])
                for i in range(options.n):
                    yield sse({**head, "choices": [{"index": base + i, "text": event.prompt_text,
                                                    "finish_reason": None, "logprobs": logprobs}]})
            elif isinstance(event, Token):
                choice = {"index": base + event.index, "text": event.text, "token": event.token_id,
                          "finish_reason": None, "logprobs": None}
                if options.logprobs is not None:
                    choice["logprobs"] = completion_logprobs([event], 0)
                yield sse({**head, "choices": [choice]})
            elif isinstance(event, Finish):
                yield sse({**head, "choices": [{"index": base + event.index, "text": "",
                                                "finish_reason": FINISH[event.reason], "logprobs": None,
                                                **incomplete(event)}]})
            elif isinstance(event, Done):
                dones.append(event)
        for chunk in stream_end(head, dones, options.include_usage, options.predicted):
            yield chunk


def completion_logprobs(tokens: list[Token], offset: int) -> dict:
    """OpenAI completions layout over the generated tokens, their text starting at character `offset`."""
    return _logprob_layout([t.piece if t.piece is not None else t.text for t in tokens],
                           [t.logprob for t in tokens], [t.top_logprobs for t in tokens], offset)


def prompt_logprobs(details: list[PromptToken]) -> dict:
    """The echoed prompt in the same layout; its first token has no logprob (nothing predicts it)."""
    return _logprob_layout([d.text for d in details], [d.logprob for d in details],
                           [d.top_logprobs for d in details], 0)


def _logprob_layout(pieces: list[str], logprobs: list, tops: list, offset: int) -> dict:
    """Parallel arrays: token texts, their logprobs, {text: logprob} alternatives, character offsets."""
    offsets = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=offset)) if pieces else []
    alternatives = [{x.text: x.logprob for x in top} if top else None for top in tops]
    return {"tokens": pieces, "token_logprobs": logprobs, "top_logprobs": alternatives, "text_offset": offsets}


def joined(first: dict, second: dict) -> dict:
    return {key: first[key] + second[key] for key in first}


def stream_end(head: dict, dones: list[Done], include_usage: bool, predicted: bool = False) -> list[bytes]:
    """The end of every OpenAI-shaped stream: the optional usage chunk (no choices), then `[DONE]`."""
    usage_chunk = [sse({**head, "choices": [], "usage": usage_of(dones, predicted=predicted)})] if include_usage else []
    return [*usage_chunk, SSE_DONE]


def usage_of(dones: list[Done], cached: bool = True, predicted: bool = False) -> dict:
    """OpenAI's usage; `cached`: with `prompt_tokens_details.cached_tokens`, the prompt tokens the worker took
    from its prefix cache (worker/engine/prefix_cache.py); `predicted`: with `completion_tokens_details`, the
    prediction's tokens accepted and rejected (the rejected ones are in completion_tokens: billed, as OpenAI does)."""
    prompt = sum(d.prompt_tokens for d in dones)
    completion = sum(d.completion_tokens for d in dones)
    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        counts["prompt_tokens_details"] = {"cached_tokens": sum(d.cached_tokens for d in dones)}
    if predicted:
        counts["completion_tokens_details"] = {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": sum(d.accepted_prediction_tokens for d in dones),
            "rejected_prediction_tokens": sum(d.rejected_prediction_tokens for d in dones)}
    return counts


def usage(results: list[Result], cached: bool = True, predicted: bool = False) -> dict:
    return usage_of([r.done for r in results if r.done is not None], cached, predicted)
