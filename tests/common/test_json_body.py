"""The one body-decoding step (`common.json_body`): each malformed class is a 4xx naming the problem, the
nesting limit is exact, and no bytes whatsoever make it raise anything but a `SluiceError`."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from litestar import Request

from common.errors import BodyIncomplete, InvalidJSON, PayloadTooLarge, SluiceError, UnsupportedMediaType
from common.json_body import MAX_DEPTH, check_content_type, decode_json, nesting_depth_exceeds, read_body
from testkit.fuzzing import examples

MALFORMED = [  # body, what the message must name
    (b'{"prompt": "\xff\xfe"}', "UTF-8"),
    (b"[" * 5000 + b"]" * 5000, "deeper than 64"),
    (b'{"a": NaN}', "NaN"),
    (b'{"a": -Infinity}', "Infinity"),
    (b'{"a": 1} {"b": 2}', "trailing"),
    (b"", "empty"),
    (b"  \n", "empty"),
    (b'{"a": 1e999}', "out of range"),
    (b'{"a": "\\ud800"}', "not valid JSON"),
    (b"{nope", "not valid JSON"),
    (b'"unterminated', "not valid JSON"),
]


@pytest.mark.parametrize(("raw", "named"), MALFORMED)
def test_malformed_bodies_are_400_naming_the_problem(raw, named):
    with pytest.raises(InvalidJSON) as refused:
        decode_json(raw, 1 << 20)
    assert refused.value.status == 400 and refused.value.code == "invalid_json"
    assert named in refused.value.message


def test_size_limit_is_413():
    with pytest.raises(PayloadTooLarge) as refused:
        decode_json(b'{"a": "' + b"x" * 100 + b'"}', 64)
    assert refused.value.status == 413 and "64 bytes" in refused.value.message
    assert decode_json(b'{"a": "x"}', 10) == {"a": "x"}


def test_nesting_limit_is_exact_and_ignores_strings():
    assert decode_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) == _nested(MAX_DEPTH)
    with pytest.raises(InvalidJSON):
        decode_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    deep_text = json.dumps({"prompt": "[" * 5000 + "{" * 5000}).encode()
    assert decode_json(deep_text)["prompt"].startswith("[[[")
    wide = json.dumps([[i] for i in range(10_000)]).encode()
    assert len(decode_json(wide)) == 10_000


def _nested(depth: int):
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("header", [None, "", "application/json", "Application/JSON; charset=utf-8",
                                    'application/json; charset="UTF-8"', "application/vnd.api+json"])
def test_json_content_types_are_accepted(header):
    check_content_type(header)


@pytest.mark.parametrize("header", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x",
                                    "application/json; charset=latin-1", "application/jsonx"])
def test_other_content_types_are_415(header):
    with pytest.raises(UnsupportedMediaType) as refused:
        check_content_type(header)
    assert refused.value.status == 415 and "application/json" in refused.value.message


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def _chain(depth: int, leaf, shapes: list[bool]):
    """`depth` containers inside each other (list or object per `shapes`), siblings beside each level."""
    value = leaf
    for level in range(depth):
        value = [value, 1] if shapes[level % len(shapes)] else {"k]{": value, "s": "[["}
    return value


@pytest.mark.fuzz
@given(depth=st.integers(0, 3 * MAX_DEPTH), shapes=st.lists(st.booleans(), min_size=1, max_size=5),
       leaf=st.sampled_from([1, "]]", "{[", [], {}]))
@settings(max_examples=examples(300), deadline=None)
def test_nesting_check_matches_the_real_depth(depth, shapes, leaf):
    value = _chain(depth, leaf, shapes)
    assert nesting_depth_exceeds(json.dumps(value).encode(), MAX_DEPTH) == (_depth(value) > MAX_DEPTH)


@pytest.mark.fuzz
@given(raw=st.one_of(st.binary(max_size=200),
                     st.text(max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass")),
                     st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b":", b",", b"1", b"NaN",
                                               b"\xff", b" "]), max_size=300).map(b"".join)))
@example(raw=b"[" * 5000 + b"]" * 5000)
@example(raw=b'{"prompt": "\xff\xfe"}')
@settings(max_examples=examples(500), deadline=None)
def test_any_bytes_decode_or_raise_a_sluice_error(raw):
    try:
        decode_json(raw, 1 << 16)
    except SluiceError as error:
        assert 400 <= error.status < 500


def request_of(messages: list[dict], headers: list[tuple[bytes, bytes]]) -> Request:
    """A Litestar request whose ASGI `receive` hands over `messages`, then waits like a quiet client."""
    pending = list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers, "state": {},
                    "query_string": b"", "path_params": {}}, receive)


def part(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


async def test_a_body_in_several_messages_is_read_whole():
    request = request_of([part(b'{"a": ', True), part(b"", True), part(b"1}", False)], [])
    assert await read_body(request, 64) == b'{"a": 1}'
    assert await read_body(request_of([part(b"{}", False)], [(b"content-length", b"2")]), 2) == b"{}"
    assert await read_body(request_of([part(b"", False)], []), None) == b""


async def test_an_announced_length_over_the_limit_is_413_before_anything_is_read():
    request = request_of([], [(b"content-length", b"65")])  # receive would wait forever
    with pytest.raises(PayloadTooLarge, match="64 bytes"):
        await asyncio.wait_for(read_body(request, 64), 5)


async def test_a_body_without_a_length_is_413_once_its_bytes_pass_the_limit():
    """Chunked, or a content-length that undersells it: the bytes that came are what count."""
    for headers in ([], [(b"content-length", b"10")]):
        request = request_of([part(b"x" * 40, True), part(b"x" * 40, True)], headers)  # never ends: refused first
        with pytest.raises(PayloadTooLarge, match="64 bytes"):
            await asyncio.wait_for(read_body(request, 64), 5)


async def test_a_client_gone_mid_body_is_a_refusal_not_a_fault():
    request = request_of([part(b"{", True), {"type": "http.disconnect"}], [])
    with pytest.raises(BodyIncomplete, match="before the request body"):
        await read_body(request, 64)
