"""The tables every error answer shares (common/errors.py): the one Retry-After rule, and the one reading of a
msgspec validation error into the `param` an envelope names."""

from __future__ import annotations

import msgspec
import pytest

from common.errors import invalid_field, retry_after_header, retry_after_seconds


@pytest.mark.parametrize(("wait", "seconds", "ms"), [(0.0, 1, "0"), (0.2, 1, "200"), (1.0, 1, "1000"),
                                                     (1.001, 2, "1001"), (30.0, 30, "30000")])
def test_retry_after_rounds_up_to_whole_seconds_and_never_says_zero(wait, seconds, ms):
    assert retry_after_seconds(wait) == seconds
    assert retry_after_header(wait) == {"retry-after": str(seconds)}
    assert retry_after_header(wait, ms=True) == {"retry-after": str(seconds), "retry-after-ms": ms}


class Message(msgspec.Struct):
    role: str
    content: str


class Body(msgspec.Struct):
    model: str
    messages: list[Message]
    temperature: float = 1.0
    options: dict[str, int] = {}


def _field(payload) -> str | None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(payload, Body)
    return invalid_field(caught.value)


@pytest.mark.parametrize(("payload", "field"), [
    ({"messages": []}, "model"),  # missing at the top
    ({"model": "m", "messages": [], "temperature": "hot"}, "temperature"),  # wrong type at the top
    ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages"),  # deep inside a list
    ({"model": "m", "messages": [{"content": "hi"}]}, "messages"),  # missing deep inside: the top field
    ({"model": "m", "messages": [], "options": {"top-k": "x"}}, "options"),
])
def test_the_field_is_the_top_level_one_msgspec_names(payload, field):
    assert _field(payload) == field


def test_an_error_about_the_whole_body_names_no_field():
    assert _field([1, 2]) is None
