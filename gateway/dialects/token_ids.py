"""Token-id prompts as the dialects take them (OpenAI's `prompt` and `tokens`, SGLang's `input_ids`), checked at C
speed. A body of 4 MiB holds some 700k ids; a Python loop over them costs the event loop, which every team's
requests share, a quarter of a second a pass, where msgspec's conversion costs a tenth of that."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

TokenId = Annotated[int, msgspec.Meta(ge=0)]


def int_list(value: Any, *, non_negative: bool = False) -> list[int] | None:
    """`value` as a new list of ints (no bools), or None when it is not one."""
    try:
        return msgspec.convert(value, list[TokenId] if non_negative else list[int])
    except msgspec.ValidationError:
        return None


def int_lists(value: Any, *, non_negative: bool = False) -> list[list[int]] | None:
    """`value` as new non-empty lists of ints, or None when it is not that."""
    try:
        lists = msgspec.convert(value, list[list[TokenId]] if non_negative else list[list[int]])
    except msgspec.ValidationError:
        return None
    return lists if all(lists) else None
