"""Every dialect's `parse`, on arbitrary JSON values and on bodies shaped like its own (its field names, nested
structs included, with arbitrary values): a bad body is a `SluiceError` the dialect renders, never another
exception (which would be a 500). Fixed seeds in `make test` (tests/conftest.py), new ones in `make fuzz`."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.dialects.datacrunch.routes import GENERATE as DATACRUNCH
from gateway.dialects.friendli.routes import CHAT as FRIENDLI_CHAT
from gateway.dialects.friendli.routes import COMPLETIONS as FRIENDLI
from gateway.dialects.friendli.routes import COMPLETIONS_LEGACY as FRIENDLI_LEGACY
from gateway.dialects.monster.dialect import MonsterBody
from gateway.dialects.monster.routes import MONSTER
from gateway.dialects.openai.chat import ChatBody
from gateway.dialects.openai.completions import CompletionBody
from gateway.dialects.openai.routes import CHAT, OPENAI
from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.request import SGLangBody
from gateway.dialects.tgi.request import GenerateBody
from gateway.dialects.tgi.routes import COMPAT, GENERATE, GENERATE_STREAM
from gateway.errors import SluiceError
from testkit.fuzzing import examples

pytestmark = pytest.mark.fuzz

# what JSON can carry: no NaN or Infinity (the body decoder refuses them), astral text, huge and tiny numbers
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 1.5e20, -1e308, 5e-324, 0.5, -0.0]),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
                    st.sampled_from(["", "😀", "𝔘", "²", "١٢", "0", "-1", "\x00", "json", "regex", "text"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


# well-known values of the keys whose meaning depends on a small vocabulary
KNOWN = {"response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema",
                                                                           "regex", "x"])},
                                                 optional={"schema": json_values, "json_schema": json_values}),
         "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool", "x"])},
                                                    optional={"content": json_values, "tool_calls": json_values}),
                              max_size=3),
         "grammar": st.fixed_dictionaries({"type": st.sampled_from(["json", "regex", "x"])},
                                          optional={"value": json_values})}


def shaped_like(kind: type, depth: int = 0) -> st.SearchStrategy:
    """Bodies with `kind`'s field names (any subset), each value arbitrary or, for a field holding structs
    (or lists of them) or a well-known vocabulary, shaped like those."""
    fields = {}
    for field in msgspec.inspect.type_info(kind).fields:
        choices = [json_values]
        if field.encode_name in KNOWN:
            choices.append(KNOWN[field.encode_name])
        for nested in _structs(field.type):
            if depth < 2:
                choices += [shaped_like(nested, depth + 1), st.lists(shaped_like(nested, depth + 1), max_size=2)]
        fields[field.encode_name] = st.one_of(*choices)
    return st.fixed_dictionaries({}, optional=fields)


def _structs(t):
    if isinstance(t, msgspec.inspect.UnionType):
        for member in t.types:
            yield from _structs(member)
    elif isinstance(t, msgspec.inspect.ListType):
        yield from _structs(t.item_type)
    elif isinstance(t, msgspec.inspect.StructType):
        yield t.cls


CASES = {
    "openai-completions": ([OPENAI, FRIENDLI, FRIENDLI_LEGACY], CompletionBody, "/v1/completions"),
    "openai-chat": ([CHAT, FRIENDLI_CHAT], ChatBody, "/v1/chat/completions"),
    "monster": ([MONSTER], MonsterBody, "/v1/generate"),
    "tgi": ([GENERATE, GENERATE_STREAM, COMPAT, DATACRUNCH], GenerateBody, "/generate"),
    "sglang": ([SGLANG], SGLangBody, "/generate"),
}


def only_sluice_errors(dialects, body, route: str) -> None:
    for dialect in dialects:
        try:
            dialect.parse(body, route)
        except SluiceError as error:
            status, _ = dialect.error_body(error)
            assert 400 <= status < 500 and error.message, (dialect.name, body, error)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_raises_only_sluice_errors(name):
    dialects, kind, route = CASES[name]

    @given(body=st.one_of(json_values, shaped_like(kind)))
    @settings(max_examples=examples(300), deadline=None)
    @example(body={"model": "m", "prompt": "x", "logit_bias": {"²": 1}})  # a Unicode digit is no token id
    @example(body={"text": "x", "sampling_params": {"logit_bias": {"١": 1}}})
    @example(body={"model": "m", "prompt": "x", "watermark": {"gamma": 1.5e20, "delta": 1.5e20}})
    def check(body):
        only_sluice_errors(dialects, body, route)

    check()
