"""The core of an OpenAI request: the decoding fields completions and chat share, their validation, and
their mapping to `SamplingParams`.

Friendli's completions and chat bodies are a superset of OpenAI's, so one struct serves both and the
OpenAI routes accept the Friendli fields as extensions. JSON null always means "unset". Fields the
engine cannot apply yet are still carried to the worker in `SamplingParams` (never dropped here).
"""

from __future__ import annotations

import time
from typing import Literal

import msgspec

from common.protocol import Constraint, SamplingParams, Watermark
from gateway.dialects import bounds
from gateway.serving.dialect import check, fail

MAX_STOPS = 4  # OpenAI's own limit; the other bounds are gateway.dialects.bounds
MAX_BEAMS = 31


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class TokenSequence(msgspec.Struct):
    tokens: list[int]


class WatermarkOptions(msgspec.Struct):
    gamma: float = 0.5
    delta: float = 2.0


class OpenAIRequest(msgspec.Struct, kw_only=True):
    """The fields every completions and chat body has (OpenAI + Friendli). Every optional field may be null."""

    model: str | None = None
    max_tokens: int | None = None
    max_total_tokens: int | None = None
    min_tokens: int | None = None
    min_total_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    xtc_threshold: float | None = None
    xtc_probability: float | None = None
    n: int | None = None
    best_of: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_tokens: list[TokenSequence] | None = None
    eos_token: list[int] | None = None
    ignore_eos: bool | None = None
    seed: int | list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    encoder_repetition_penalty: float | None = None
    no_repeat_ngram: int | None = None
    encoder_no_repeat_ngram: int | None = None
    bad_words: list[str] | None = None
    bad_word_tokens: list[TokenSequence] | None = None
    logit_bias: dict[str, float] | list[float] | None = None  # a list: TGI's shape (bounds.logit_bias)
    num_beams: int | None = None
    beam_search_type: Literal["DETERMINISTIC", "STOCHASTIC", "NAIVE_SAMPLING"] | None = None
    length_penalty: float | None = None
    early_stopping: bool | None = None
    beam_compat_pre_normalization: bool | None = None
    beam_compat_no_post_normalization: bool | None = None
    response_format: dict | None = None
    timeout_microseconds: int | None = None
    include_output_logits: bool | None = None
    include_output_logprobs: bool | None = None
    forced_output_tokens: list[int] | None = None
    token_index_to_replace: list[int] | None = None
    embedding_to_replace: list[float] | None = None
    watermark: bool | WatermarkOptions | None = None
    user: str | None = None


def _set(value, default):
    return default if value is None else value


def stop_list(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    bounds.stops(stops, MAX_STOPS)
    check(all(stops), "stop sequences must not be empty", "stop")
    return stops


def seeds(seed: int | list[int] | None, choices: int) -> list[int] | None:
    """One seed for every choice (consecutive), or a list with exactly one seed per choice."""
    if seed is None:
        return None
    values = [seed] if isinstance(seed, int) else list(seed)
    check(len(values) > 0, "seed must not be an empty list", "seed")
    check(all(0 <= s < 2**63 for s in values), "seed must be a non-negative 63-bit integer", "seed")
    if len(values) not in (1, choices):
        fail(f"seed lists must hold one seed per choice ({choices})", "seed")
    return values


def constraint(response_format: dict | None) -> Constraint | None:
    """`response_format` (OpenAI, Friendli legacy string schema, Friendli modern object, TGI's chat grammar) ->
    Constraint. TGI's chat takes `{"type": "json" | "json_object" | "regex", "value": ...}` and constrains to the
    schema in `value` (huggingface_hub's chat_completion sends `json_object` with it): never dropped."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    check(kind in ("text", "json_object", "json_schema", "regex", "json"),
          "response_format.type must be one of text, json_object, json_schema, regex, json", "response_format")
    if kind == "text":
        return None
    schema = response_format.get("schema")
    if schema is None and kind in ("json", "json_object", "regex"):
        schema = response_format.get("value")  # TGI's key
    check(kind != "json" or isinstance(schema, (dict, str)) and schema,
          "response_format of type json needs its JSON schema in value", "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if spec is not None:  # modern: {"type":"json_schema","json_schema":{"name":..,"schema":{..}}}
            check(isinstance(spec, dict) and isinstance(spec.get("schema"), dict),
                  "response_format.json_schema.schema must be a JSON object", "response_format")
            schema = spec["schema"]
        check(isinstance(schema, (dict, str)) and schema, "response_format needs a JSON schema", "response_format")
        return _schema(schema)
    if kind == "regex":
        check(isinstance(schema, str) and schema, "response_format.schema must hold the regex", "response_format")
        bounds.grammar(schema, "response_format")
        return Constraint("regex", schema)
    if isinstance(schema, (dict, str)) and schema:  # json_object with an optional (legacy) schema
        return _schema(schema)
    return Constraint("json_object", "")


def _schema(schema: dict | str) -> Constraint:
    text = schema if isinstance(schema, str) else msgspec.json.encode(schema).decode()
    bounds.grammar(text, "response_format", None if isinstance(schema, str) else schema)
    return Constraint("json_schema", text)


def deadline(timeout_microseconds: int | None) -> float | None:
    if timeout_microseconds is None:
        return None
    check(0 < timeout_microseconds < 2**31, "timeout_microseconds must be a positive int32", "timeout_microseconds")
    return time.time() + timeout_microseconds / 1e6


def _token_lists(value: list[TokenSequence] | None, name: str, limit: int) -> list[list[int]]:
    bounds.at_most(value, limit, name, "token sequences")
    lists = [list(t.tokens) for t in value or []]
    bounds.each_at_most(lists, bounds.MAX_SEQUENCE_TOKENS, name, "tokens")
    if not all(lists):
        fail(f"every {name} entry needs at least one token", name)
    if not all(t >= 0 for ids in lists for t in ids):
        fail(f"{name} token ids must be non-negative", name)
    return lists


def _ranges(body: OpenAIRequest, max_temperature: float | None) -> None:
    t = body.temperature
    check(t is None or (t >= 0 and (max_temperature is None or t <= max_temperature)),
          f"temperature must be between 0 and {max_temperature}" if max_temperature else "temperature must be >= 0",
          "temperature")
    check(body.top_p is None or 0 < body.top_p <= 1, "top_p must be in (0, 1]", "top_p")
    check(body.top_k is None or body.top_k >= 0, "top_k must be >= 0 (0 = off)", "top_k")
    check(body.min_p is None or 0 <= body.min_p <= 1, "min_p must be in [0, 1]", "min_p")
    check(body.typical_p is None or 0 < body.typical_p <= 1, "typical_p must be in (0, 1]", "typical_p")
    for name in ("xtc_threshold", "xtc_probability"):
        value = getattr(body, name)
        if not (value is None or 0 <= value <= 1):
            fail(f"{name} must be in [0, 1]", name)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if not (value is None or -2 <= value <= 2):
            fail(f"{name} must be between -2 and 2", name)
    for name in ("repetition_penalty", "encoder_repetition_penalty"):
        value = getattr(body, name)
        if not (value is None or value > 0):
            fail(f"{name} must be > 0 (1.0 = none)", name)
    for name in ("no_repeat_ngram", "encoder_no_repeat_ngram"):
        value = getattr(body, name)
        if not (value is None or value >= 1):
            fail(f"{name} must be >= 1 (1 = off)", name)
    bounds.at_most(body.eos_token, bounds.MAX_TOKEN_IDS, "eos_token", "token ids")
    check(body.eos_token is None or all(t >= 0 for t in body.eos_token), "eos_token ids must be >= 0", "eos_token")
    check(body.forced_output_tokens is None or all(t >= 0 for t in body.forced_output_tokens),
          "forced_output_tokens ids must be >= 0", "forced_output_tokens")


def _lengths(body: OpenAIRequest, default_max: int | None, score_only: bool) -> tuple[int | None, int | None, int]:
    check(body.max_tokens is None or body.max_total_tokens is None,
          "max_tokens and max_total_tokens are mutually exclusive", "max_total_tokens")
    check(body.min_tokens is None or body.min_total_tokens is None,
          "min_tokens and min_total_tokens are mutually exclusive", "min_total_tokens")
    if score_only:  # echo: max_tokens 0 scores the prompt (its logprobs), generating nothing, as OpenAI does
        check(body.max_tokens is None or body.max_tokens >= 0, "max_tokens must be at least 0", "max_tokens")
    else:
        check(body.max_tokens is None or body.max_tokens >= 1, "max_tokens must be at least 1", "max_tokens")
    check(body.max_total_tokens is None or body.max_total_tokens >= 1, "max_total_tokens must be at least 1",
          "max_total_tokens")
    check(body.min_tokens is None or body.min_tokens >= 0, "min_tokens must be >= 0", "min_tokens")
    check(body.min_total_tokens is None or body.min_total_tokens >= 0, "min_total_tokens must be >= 0",
          "min_total_tokens")
    max_tokens = body.max_tokens if body.max_tokens is not None else (
        None if body.max_total_tokens is not None else default_max)
    min_tokens = body.min_tokens or 0
    check(max_tokens is None or min_tokens <= max_tokens, "min_tokens must not exceed max_tokens", "min_tokens")
    return max_tokens, body.max_total_tokens, min_tokens


def _beams(body: OpenAIRequest, n: int, stream: bool) -> int:
    beams = _set(body.num_beams, 1)
    check(1 <= beams <= MAX_BEAMS, f"num_beams must be between 1 and {MAX_BEAMS}", "num_beams")
    check(not (body.beam_compat_no_post_normalization and not body.beam_compat_pre_normalization),
          "beam_compat_no_post_normalization needs beam_compat_pre_normalization", "beam_compat_no_post_normalization")
    if beams > 1:
        check(n <= beams, "n must not exceed num_beams", "n")
        check(not stream, "beam search cannot be streamed", "stream")
        check(not body.stop, "stop is incompatible with beam search; use stop_tokens", "stop")
        if _set(body.beam_search_type, "DETERMINISTIC") == "DETERMINISTIC":
            check(not body.top_k and body.top_p in (None, 1.0),
                  "DETERMINISTIC beam search does not allow top_k or top_p", "beam_search_type")
    return beams


def sampling_params(body: OpenAIRequest, *, default_max_tokens: int | None, max_temperature: float | None,
                    logprobs: int | None, score_only: bool = False) -> SamplingParams:
    """Validate the shared fields (naming the field on failure) and build the internal parameters."""
    _ranges(body, max_temperature)
    n = _set(body.n, 1)
    check(1 <= n <= 128, "n must be between 1 and 128", "n")
    best_of = _set(body.best_of, n)
    check(n <= best_of <= 128, "best_of must be between n and 128", "best_of")
    stream = bool(body.stream)
    check(not (stream and best_of > n), "best_of > n cannot be streamed", "best_of")
    beams = _beams(body, n, stream)
    check(beams == 1 or best_of == n, "best_of cannot be combined with num_beams", "best_of")
    max_tokens, max_total, min_tokens = _lengths(body, default_max_tokens, score_only)
    check(not (min_tokens and body.response_format and body.response_format.get("type") != "text"),
          "min_tokens is not supported with response_format", "min_tokens")
    bad_word_tokens = _token_lists(body.bad_word_tokens, "bad_word_tokens", bounds.MAX_BAD_WORDS)
    bounds.bad_words(body.bad_words, bad_word_tokens)
    if body.include_output_logprobs and logprobs is None:
        logprobs = 0
    watermark = body.watermark
    return SamplingParams(
        max_tokens=max_tokens, max_total_tokens=max_total, min_tokens=min_tokens,
        min_total_tokens=body.min_total_tokens,
        temperature=_set(body.temperature, 1.0), top_k=_set(body.top_k, 0), top_p=_set(body.top_p, 1.0),
        min_p=_set(body.min_p, 0.0), typical_p=_set(body.typical_p, 1.0),
        xtc_threshold=_set(body.xtc_threshold, 0.0), xtc_probability=_set(body.xtc_probability, 0.0),
        seed=seeds(body.seed, best_of if beams == 1 else 1),
        repetition_penalty=_set(body.repetition_penalty, 1.0), presence_penalty=_set(body.presence_penalty, 0.0),
        frequency_penalty=_set(body.frequency_penalty, 0.0),
        encoder_repetition_penalty=_set(body.encoder_repetition_penalty, 1.0),
        no_repeat_ngram_size=0 if _set(body.no_repeat_ngram, 1) <= 1 else body.no_repeat_ngram,
        encoder_no_repeat_ngram_size=0 if _set(body.encoder_no_repeat_ngram, 1) <= 1 else body.encoder_no_repeat_ngram,
        bad_words=list(body.bad_words or []), bad_word_tokens=bad_word_tokens,
        logit_bias=bounds.logit_bias(body.logit_bias), stop=stop_list(body.stop),
        stop_token_ids=[t for ids in _token_lists(body.stop_tokens, "stop_tokens", bounds.MAX_TOKEN_IDS) for t in ids],
        eos_token_ids=list(body.eos_token or []), ignore_eos=bool(body.ignore_eos),
        n=n, best_of=best_of if best_of != n else None,
        num_beams=beams, beam_search_type=_set(body.beam_search_type, "DETERMINISTIC"),
        length_penalty=_set(body.length_penalty, 1.0), early_stopping=bool(body.early_stopping),
        beam_compat_pre_normalization=bool(body.beam_compat_pre_normalization),
        beam_compat_no_post_normalization=bool(body.beam_compat_no_post_normalization),
        logprobs=logprobs, include_output_logits=bool(body.include_output_logits),
        forced_output_tokens=list(body.forced_output_tokens or []),
        constraint=constraint(body.response_format),
        watermark=None if not watermark else (
            Watermark() if watermark is True else Watermark(watermark.gamma, watermark.delta)))
