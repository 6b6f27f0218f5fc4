"""MonsterAPI `/v1/generate` bodies -> internal requests (defaults, beam mapping, validation, mock)."""

from __future__ import annotations

import pytest

from gateway.dialects.monster.dialect import MOCK_TEXT, MonsterGenerate
from gateway.errors import ValidationFailed

MONSTER = MonsterGenerate()
# what monsterapi 1.0.9.3 LLMClient sends (request.dict(): every field)
CLIENT = {"model": "m", "formatted_prompt": "Hello", "messages": None, "max_tokens": 256, "n": 1, "best_of": 1,
          "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "temperature": 1.0,
          "top_p": 1.0, "top_k": -1, "min_p": 0.0, "use_beam_search": False, "length_penalty": 1.0,
          "early_stopping": False, "mock_response": False}


def parse(**values):
    return MONSTER.parse({**CLIENT, **values}, "/v1/generate")


def test_client_body_defaults():
    parsed = parse()
    request = parsed.requests[0]
    assert request.prompt == "Hello" and request.messages is None
    params = request.params
    assert (params.max_tokens, params.n, params.best_of, params.num_beams, params.top_k) == (256, 1, None, 1, 0)
    assert "mock_response" not in parsed.extra and not parsed.stream


def test_prompt_messages_and_minimal_body():
    assert MONSTER.parse({"model": "m", "prompt": "Hi"}, "/v1/generate").requests[0].params.max_tokens == 256
    request = parse(formatted_prompt=None, messages=[{"role": "user", "content": "Hi"}]).requests[0]
    assert request.messages == [{"role": "user", "content": "Hi"}] and request.prompt is None


def test_beam_search_uses_best_of_beams():
    params = parse(use_beam_search=True, best_of=4, n=2, length_penalty=0.5, early_stopping=True).requests[0].params
    assert (params.num_beams, params.n, params.best_of, params.length_penalty, params.early_stopping) \
        == (4, 2, None, 0.5, True)


def test_best_of_sampling():
    params = parse(best_of=3, n=1, top_k=10, min_p=0.05).requests[0].params
    assert (params.best_of, params.top_k, params.min_p) == (3, 10, 0.05)


def test_client_default_best_of_one_means_n():
    assert parse(n=3).requests[0].params.best_of is None


def test_mock_response_is_canned():
    parsed = parse(mock_response=True, n=2)
    mock = parsed.extra["mock_response"]
    assert mock["text"] == [MOCK_TEXT, MOCK_TEXT] and mock["usage"]["total_tokens"] == 0
    assert [c["index"] for c in mock["choices"]] == [0, 1]


@pytest.mark.parametrize(("values", "param"), [
    ({"model": None}, "model"),
    ({"formatted_prompt": None}, "prompt"),
    ({"prompt": "also"}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"best_of": 0}, "best_of"),
    ({"use_beam_search": True}, "best_of"),
    ({"stream": True, "best_of": 2}, "stream"),
    ({"stream": True, "mock_response": True}, "mock_response"),
    ({"messages": [{"role": "x"}], "formatted_prompt": None}, "messages"),
    ({"n": "two"}, "n"),
])
def test_validation_names_the_field(values, param):
    with pytest.raises(ValidationFailed) as info:
        parse(**values)
    assert info.value.param == param
