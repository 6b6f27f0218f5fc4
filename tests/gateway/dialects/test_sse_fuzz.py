"""Fuzzing the gateway's SSE writer (`sse` in gateway/serving/dialect.py), which frames every streamed
chunk of every dialect: whatever JSON value a renderer hands it, it writes one `data:` line that decodes
back to that value, and no exception escapes. Seeds are fixed (derandomize)."""

from __future__ import annotations

import math

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.serving.dialect import sse

# what renderers build: worker text (no lone surrogates: msgspec decoded it), numbers, nested objects;
# a non-finite float is what a broken number would be
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text())
payloads = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                             max_size=4),
                        max_leaves=16)


def _finite(value):
    """The value as JSON carries it: msgspec writes NaN and infinities as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(payload=payloads, space=st.booleans())
@example(payload={"text": "line\nbreak\r\n\u2028data: [DONE]\n\n"}, space=True)
@example(payload={"logprob": -math.inf, "x": math.nan}, space=False)
def test_any_payload_is_one_sse_event_that_decodes_back(payload, space):
    frame = sse(payload, space=space)
    prefix = b"data: " if space else b"data:"
    assert frame.startswith(prefix) and frame.endswith(b"\n\n")
    body = frame[len(prefix):-2]
    assert b"\n" not in body and b"\r" not in body  # a raw line break would end the event early
    assert msgspec.json.decode(body) == _finite(payload)
