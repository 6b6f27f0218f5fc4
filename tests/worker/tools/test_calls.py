"""The call parser: content and calls out of streamed text, however the text is chunked."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.tools.calls import CallParser
from worker.tools.syntax import JSON_CALLS, TAGGED_CALLS

NAMES = ("get_weather", "get_time", "search")


def feed(text: str, chunks: list[int] | None = None, syntax=JSON_CALLS, calls_only: bool = False):
    """Feed `text` cut at `chunks` (offsets); the parser, the content and the deltas it gave."""
    parser = CallParser(syntax, NAMES, choice=3, calls_only=calls_only)
    cuts = sorted(set(c for c in (chunks or []) if 0 < c < len(text)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    content, deltas = [], []
    for number, piece in enumerate(pieces):
        released, pieces_of_calls = parser.push(piece, final=number == len(pieces) - 1)
        content.append(released)
        deltas += pieces_of_calls
    return parser, "".join(content), deltas


def joined(deltas) -> dict[int, dict]:
    """Deltas folded per call: the id and name of its first piece, its arguments concatenated."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        assert delta.index == 3
        if delta.call not in calls:
            assert delta.id and delta.name, "the first piece of a call names it"
            calls[delta.call] = {"id": delta.id, "name": delta.name, "arguments": ""}
        else:
            assert delta.id is None and delta.name is None
        calls[delta.call]["arguments"] += delta.arguments
    return calls


def as_dicts(parser) -> dict[int, dict]:
    return {i: {"id": c.id, "name": c.name, "arguments": c.arguments} for i, c in enumerate(parser.calls)}


def test_text_without_calls_is_all_content():
    for text in ["Hello there.", "Use {\"na", "  spaced  ", '{"type": "function"}', ""]:
        parser, content, deltas = feed(text, list(range(len(text))))
        assert content == text and not parser.calls and not deltas


def test_content_then_calls_then_content():
    text = ('Let me look.\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '{"name": "get_time", "arguments": {"zone": "CET"}}\n\nDone.')
    parser, content, deltas = feed(text)
    assert content == "Let me look.Done."
    assert [(c.name, json.loads(c.arguments)) for c in parser.calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]
    assert joined(deltas) == as_dicts(parser)
    assert not parser.open
    assert len({c.id for c in parser.calls}) == 2 and all(c.id.startswith("call_") for c in parser.calls)


def test_calls_only_separated_by_newlines():
    text = '{"name": "search", "arguments": {"q": "a"}}\n{"name": "search", "arguments": {"q": "b"}}'
    parser, content, _ = feed(text)
    assert content == "" and [c.arguments for c in parser.calls] == ['{"q": "a"}', '{"q": "b"}']


def test_braces_and_quotes_inside_strings_do_not_end_the_arguments():
    arguments = '{"q": "a}b\\"c{[", "n": [1, {"x": "]"}], "t": true}'
    parser, content, _ = feed('{"name": "search", "arguments": ' + arguments + "}")
    assert content == "" and parser.calls[0].arguments == arguments and not parser.open
    assert json.loads(parser.calls[0].arguments)["q"] == 'a}b"c{['


def test_scalar_arguments():
    parser, _, _ = feed('{"name": "search", "arguments": 42}')
    assert parser.calls[0].arguments == "42" and not parser.open
    parser, _, _ = feed('{"name": "search", "arguments": "x}"}')
    assert parser.calls[0].arguments == '"x}"' and not parser.open


def test_a_cut_call_stays_open_with_its_partial_arguments():
    parser, content, deltas = feed('Sure {"name": "get_weather", "arguments": {"city": "Par')
    assert content == "Sure" and parser.open
    assert parser.calls[0].arguments == '{"city": "Par' and joined(deltas)[0]["arguments"] == '{"city": "Par'


def test_a_head_cut_short_is_content():
    parser, content, _ = feed('Sure {"name": "get_wea')
    assert content == 'Sure {"name": "get_wea' and not parser.calls and not parser.open


def test_a_calls_only_head_cut_short_is_that_functions_call():
    """Forced or required tools: what the grammar allows is a call, so a head cut by max_tokens that can name one
    function only is its call, open and without arguments (OpenAI returns it with finish_reason "length")."""
    parser, content, deltas = feed('{"name": "get_wea', calls_only=True)
    assert content == "" and parser.open and [(c.name, c.arguments) for c in parser.calls] == [("get_weather", "")]
    assert joined(deltas) == as_dicts(parser)
    parser, _, _ = feed('{"name": "get_', calls_only=True)  # get_weather or get_time: no call can be named
    assert not parser.calls


def test_calls_only_never_gives_content():
    text = '{"name": "search", "arguments": {"q": "a"}}\n{"name": "search", "arguments": {"q": "b"}}\n{"na'
    for cuts in ([], list(range(len(text)))):
        parser, content, deltas = feed(text, cuts, calls_only=True)
        assert content == "" and len(parser.calls) == 2 and not parser.open
        assert joined(deltas) == as_dicts(parser)


def test_tagged_syntax():
    text = 'ok <tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    parser, content, _ = feed(text, syntax=TAGGED_CALLS)
    assert content == "ok" and parser.calls[0].name == "get_time" and parser.calls[0].arguments == '{"zone": "UTC"}'


TEXTS = [
    'Let me look.\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
    '{"name": "get_time", "arguments": {"zone": "a}\\"{"}} and then {"name": "search", "arguments": {}} bye ',
    '{"name": "search", "arguments": {"q": [1, 2, {"k": null}]}}',
    'no calls here {"name" but close { "name": "x"',
]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(TEXTS), st.lists(st.integers(min_value=1, max_value=200), max_size=40))
def test_any_chunking_gives_the_same_split(text, cuts):
    whole, whole_content, _ = feed(text)
    parser, content, deltas = feed(text, cuts)
    assert content == whole_content
    assert [(c.name, c.arguments) for c in parser.calls] == [(c.name, c.arguments) for c in whole.calls]
    assert joined(deltas) == as_dicts(parser)
