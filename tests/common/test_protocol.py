"""The gateway-worker event stream: every event the worker can build decodes on the gateway, and no bytes
reaching the gateway's decoder raise anything but msgspec's own errors.

Regression (#19): a request whose repetition penalty is 0 in float32 gave NaN scores; msgspec wrote the
NaN cumulative logprob as `null` into a non-optional float, and the gateway broke the stream with a 502.
Events now hold finite floats only (common/protocol.py), checked where they are built.
"""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from common.protocol import (
    LOGPROB_FLOOR,
    Accepted,
    Done,
    Error,
    Finish,
    PromptToken,
    Token,
    TopLogprob,
    decode_event,
    encode_event,
)

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
ids = st.integers(0, 2**31)
texts = st.text(max_size=20)  # what a tokenizer decodes and msgspec reads: no lone surrogates
# every float the engine can produce, NaN and both infinities included
floats = st.floats(allow_nan=True, allow_infinity=True)
logprobs = st.one_of(floats, st.just(-math.inf), st.floats(max_value=0.0))
sums = st.floats(allow_nan=True, allow_infinity=True)


def build(kind, **fields):
    """The event, or None when the protocol refuses its numbers (the worker then sends an Error)."""
    try:
        return kind(**fields)
    except ValueError:
        return None


top = st.builds(lambda t, lp, text: build(TopLogprob, token_id=t, logprob=lp, text=text), ids, logprobs, texts)
tops = st.none() | st.lists(top, max_size=4)
float_lists = st.none() | st.lists(floats, max_size=6)

tokens = st.builds(
    lambda index, token, text, special, piece, lp, top_list, hidden, logits, ids_list: build(
        Token, index=index, token_id=token, text=text, special=special, piece=piece, logprob=lp,
        top_logprobs=top_list, hidden_state=hidden, logits=logits, token_ids_logprobs=ids_list),
    st.integers(0, 127), ids, texts, st.booleans(), st.none() | texts, st.none() | logprobs, tops, float_lists,
    float_lists, tops)
finishes = st.builds(
    lambda index, reason, text, token_ids, seed, matched, cumulative, score, incomplete: build(
        Finish, index=index, reason=reason, text=text, token_ids=token_ids, seed=seed, matched_stop=matched,
        cumulative_logprob=cumulative, score=score, incomplete=incomplete),
    st.integers(0, 127), st.sampled_from(["length", "eos_token", "stop_sequence", "stop_token", "cancelled", "error"]),
    texts, st.lists(ids, max_size=5), st.integers(0, 2**63), st.none() | texts | ids, sums, st.none() | sums,
    st.booleans())
prompt_tokens = st.builds(lambda t, text, lp, top_list: build(PromptToken, id=t, text=text, logprob=lp,
                                                              top_logprobs=top_list),
                          ids, texts, st.none() | logprobs, tops)
accepted = st.builds(
    lambda count, prompt, seeds, details, text, v, q: build(
        Accepted, prompt_tokens=count, prompt_ids=prompt, seeds=seeds, prompt_details=details, prompt_text=text,
        validation_time_s=v, queue_time_s=q),
    st.integers(0, 4096), st.lists(ids, max_size=5), st.lists(st.integers(0, 2**63), max_size=3),
    st.none() | st.lists(prompt_tokens, max_size=3), st.none() | texts, floats, floats)
done = st.builds(Done, st.integers(0, 2**31), st.integers(0, 2**31), st.integers(0, 2**31), texts)
errors = st.builds(Error, st.sampled_from(["validation", "not_found", "overloaded", "too_long", "unavailable",
                                          "internal", "timeout", "unauthorized"]), texts, st.none() | texts)
events = st.one_of(tokens, finishes, accepted, done, errors)


def _valid(value) -> bool:
    """Nested values the protocol refused come back as None from build(): such an event is not built."""
    if isinstance(value, (Token, PromptToken)):
        return all(_valid(t) for t in (value.top_logprobs or []) + (getattr(value, "token_ids_logprobs", None) or []))
    if isinstance(value, Accepted):
        return all(d is not None and _valid(d) for d in value.prompt_details or [])
    return value is not None


@PROPERTY
@given(event=events)
@example(event=build(Token, index=0, token_id=5, text="x", logprob=-math.inf,
                     top_logprobs=[TopLogprob(5, -math.inf, "x")]))
def test_every_event_the_worker_can_build_round_trips(event):
    if event is None or not _valid(event):
        return
    line = encode_event(event)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]  # one event, one NDJSON line
    assert decode_event(line) == event


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_broken_logprob_is_refused_where_the_event_is_built(bad):
    for make in (lambda: Token(index=0, token_id=1, text="", logprob=bad), lambda: TopLogprob(1, bad),
                 lambda: PromptToken(1, "a", bad)):
        with pytest.raises(ValueError, match="logprob"):
            make()
    with pytest.raises(ValueError, match="cumulative_logprob"):
        Finish(index=0, reason="length", text="", token_ids=[], seed=0, cumulative_logprob=bad)
    with pytest.raises(ValueError, match="hidden_state"):
        Token(index=0, token_id=1, text="", hidden_state=[0.5, bad])


def test_minus_infinity_travels_as_the_floor_openai_reports():
    token = Token(index=0, token_id=1, text="", logprob=-math.inf, top_logprobs=[TopLogprob(2, -math.inf)])
    decoded = decode_event(encode_event(token))
    assert decoded.logprob == LOGPROB_FLOOR and decoded.top_logprobs[0].logprob == LOGPROB_FLOOR


def test_the_null_that_broke_the_gateway_is_a_decode_error_never_another_exception():
    line = b'{"type":"finish","index":0,"reason":"length","text":"","token_ids":[],"seed":0,"cumulative_logprob":null}'
    with pytest.raises(msgspec.ValidationError):
        decode_event(line)


def _json_values():
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12),
                                                                                             inner, max_size=4),
                        max_leaves=12)


TAGS = ["accepted", "token", "finish", "done", "error", "unknown", ""]


@PROPERTY
@given(data=st.binary(max_size=300))
@example(data=b'{"type":"finish","cumulative_logprob":1e400}')
@example(data=b'{"type":"token","index":0,"token_id":1,"text":"\\ud800"}')
@example(data=b"[" * 5000)
def test_arbitrary_bytes_raise_only_decode_errors(data):
    try:
        decode_event(data)
    except msgspec.DecodeError:  # ValidationError is one
        pass


@PROPERTY
@given(tag=st.sampled_from(TAGS), fields=st.dictionaries(
    st.sampled_from(["index", "token_id", "text", "logprob", "top_logprobs", "reason", "token_ids", "seed",
                     "cumulative_logprob", "score", "prompt_tokens", "prompt_ids", "seeds", "kind", "message",
                     "completion_tokens", "compute_tokens", "hidden_state", "extra"]), _json_values(), max_size=8))
def test_event_shaped_json_raises_only_decode_errors(tag, fields):
    """Closer to real lines than random bytes: right tags, known keys, values of any JSON type."""
    try:
        decode_event(msgspec.json.encode({"type": tag, **fields}))
    except msgspec.DecodeError:
        pass
