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


class Limits(msgspec.Struct, forbid_unknown_fields=True):
    rpm: int | None = None


class Body(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    messages: list[Message] = []
    temperature: float = 1.0
    options: dict[str, int] = {}
    limits: Limits | None = None


def _fields(payload) -> tuple[str | None, str | None]:
    """(the dialects' param, the admin API's param) for a body that fails to convert."""
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(payload, Body)
    return invalid_field(caught.value), invalid_field(caught.value, top_level=False)


@pytest.mark.parametrize(("payload", "top", "named"), [
    ({}, "model", "model"),  # missing at the top
    ({"model": "m", "temperature": "hot"}, "temperature", "temperature"),  # wrong type at the top
    ({"model": "m", "extra": 1}, "extra", "extra"),  # unknown at the top
    ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages", "messages"),  # inside a list
    ({"model": "m", "messages": [{"content": "hi"}]}, "messages", "role"),  # missing inside: the top / its own
    ({"model": "m", "options": {"top-k": "x"}}, "options", "options"),
    ({"model": "m", "limits": {"rpm": "x"}}, "limits", "limits.rpm"),  # nested: the top / the whole path
    ({"model": "m", "limits": {"qps": 1}}, "limits", "qps"),  # unknown inside: the top / its own name
])
def test_the_field_msgspec_names(payload, top, named):
    assert _fields(payload) == (top, named)


def test_an_error_about_the_whole_body_names_no_field():
    assert _fields([1, 2]) == (None, None)
