"""TGI's request body `{"inputs", "parameters"}` (also DataCrunch's, which adds `model`) and its validation,
which follows TGI's router (`validation.rs`): each rule answered with 422 naming the parameter."""

from __future__ import annotations

from typing import Any

import msgspec

from common.protocol import Constraint
from gateway.dialects import bounds
from gateway.serving.dialect import check

MAX_STOP_SEQUENCES = 4
MAX_BEST_OF = 4
MAX_TOP_N_TOKENS = 5


class Grammar(msgspec.Struct):
    type: str
    value: Any = None


class Parameters(msgspec.Struct, kw_only=True):
    """Every field may be JSON null (= unset); `text-generation` sends them all."""

    best_of: int | None = None
    decoder_input_details: bool | None = None
    details: bool | None = None
    do_sample: bool | None = None
    frequency_penalty: float | None = None
    grammar: Grammar | None = None
    max_new_tokens: int | None = None
    repetition_penalty: float | None = None
    return_full_text: bool | None = None
    seed: int | None = None
    stop: list[str] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_n_tokens: int | None = None
    top_p: float | None = None
    truncate: int | None = None
    typical_p: float | None = None
    watermark: bool | None = None
    adapter_id: str | None = None


class GenerateBody(msgspec.Struct, kw_only=True):
    inputs: str
    parameters: Parameters | None = None
    stream: bool | None = None  # `POST /` only
    model: str | None = None  # DataCrunch; the route fills in the first served model otherwise


def grammar_constraint(grammar: Grammar | None) -> Constraint | None:
    if grammar is None:
        return None
    if grammar.type == "json":
        value = grammar.value
        if isinstance(value, str):
            try:
                msgspec.json.decode(value)
            except msgspec.DecodeError:
                check(False, "grammar.value must be a JSON schema (an object or its JSON text)", "grammar")
            bounds.grammar(value, "grammar")
            return Constraint(kind="json_schema", value=value)
        check(isinstance(value, dict), "grammar.value must be a JSON schema object", "grammar")
        text = msgspec.json.encode(value).decode()
        bounds.grammar(text, "grammar", value)
        return Constraint(kind="json_schema", value=text)
    if grammar.type == "regex":
        check(isinstance(value := grammar.value, str) and value != "", "grammar.value must be a regex string",
              "grammar")
        bounds.grammar(value, "grammar")
        return Constraint(kind="regex", value=value)
    check(False, f"grammar.type must be 'json' or 'regex', not {grammar.type!r}", "grammar")
    return None


def validate(p: Parameters, stream: bool) -> None:
    """TGI's rules, each answered with 422 validation naming the parameter."""
    check(p.temperature is None or p.temperature > 0, "`temperature` must be strictly positive", "temperature")
    check(p.repetition_penalty is None or p.repetition_penalty > 0,
          "`repetition_penalty` must be strictly positive", "repetition_penalty")
    check(p.frequency_penalty is None or -2 <= p.frequency_penalty <= 2,
          "`frequency_penalty` must be >= -2.0 and <= 2.0", "frequency_penalty")
    check(p.top_p is None or 0 < p.top_p < 1, "`top_p` must be > 0.0 and < 1.0", "top_p")
    check(p.typical_p is None or 0 < p.typical_p < 1, "`typical_p` must be > 0.0 and < 1.0", "typical_p")
    check(p.top_k is None or p.top_k > 0, "`top_k` must be strictly positive", "top_k")
    check(p.max_new_tokens is None or p.max_new_tokens > 0, "`max_new_tokens` must be strictly positive",
          "max_new_tokens")
    check(p.truncate is None or p.truncate > 0, "`truncate` must be strictly positive", "truncate")
    check(len(p.stop or []) <= MAX_STOP_SEQUENCES,
          f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(p.stop or [])}", "stop")
    bounds.each_at_most(p.stop, bounds.MAX_STOP_CHARS, "stop", "characters")
    check(all(p.stop or []), "stop sequences must not be empty", "stop")
    check(p.seed is None or 0 <= p.seed < 2**64, "`seed` must be an unsigned 64-bit integer", "seed")
    check(p.top_n_tokens is None or 0 <= p.top_n_tokens <= MAX_TOP_N_TOKENS,
          f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}", "top_n_tokens")
    check(not (stream and p.decoder_input_details), "`decoder_input_details` == true is not supported when "
          "streaming tokens", "decoder_input_details")
    if p.best_of is not None:
        check(0 < p.best_of <= MAX_BEST_OF, f"`best_of` must be > 0 and <= {MAX_BEST_OF}", "best_of")
        if p.best_of > 1:
            check(sampling_of(p), "you must use sampling when `best_of` is > 1", "best_of")
            check(p.seed is None, "`seed` must not be set when `best_of` > 1", "seed")
            check(not stream, "`best_of` != 1 is not supported when streaming tokens", "best_of")


def sampling_of(p: Parameters) -> bool:
    return bool(p.do_sample) or any(v is not None for v in (p.temperature, p.top_k, p.top_p, p.typical_p))
