"""The end user and tags a request names, read from its body for the ledger (billing/records.py `end_user`,
`tags`): OpenAI's `user` and `metadata` (Chat Completions, Completions, Responses, and the dialects that share
OpenAI's bodies), Anthropic's `metadata.user_id`. Bounded here with a 400 in the dialect's envelope: an end user of
at most 256 characters, at most 16 tags of a key (1-64 characters) and a string value (at most 512), every one
printable (no control, format or line-breaking characters: they would forge a CSV row or hide in a filter)."""

from __future__ import annotations

from typing import Any

from billing.bounds import MAX_NAME_CHARS, MAX_TAG_KEY_CHARS, MAX_TAG_VALUE_CHARS, MAX_TAGS
from gateway.serving.dialect import fail

OPENAI_BODIES = frozenset({"openai", "friendli", "responses"})  # the dialects whose bodies are OpenAI's


def _end_user(value: Any, param: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        fail(f"{param} must be a string", param)
    if len(value) > MAX_NAME_CHARS or not value.isprintable():
        fail(f"{param} must be at most {MAX_NAME_CHARS} printable characters (no control or line-breaking "
             "characters)", param)
    return value


def _tags(value: Any, param: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        fail(f"{param} must be an object of string keys and string values", param)
    if len(value) > MAX_TAGS:
        fail(f"{param} may hold at most {MAX_TAGS} pairs; this request has {len(value)}", param)
    for key, tag in value.items():
        if not 1 <= len(key) <= MAX_TAG_KEY_CHARS or not key.isprintable():
            fail(f"each key of {param} must be 1 to {MAX_TAG_KEY_CHARS} printable characters", param)
        if not isinstance(tag, str):
            fail(f"{param}.{key} must be a string", param)
        if len(tag) > MAX_TAG_VALUE_CHARS or not tag.isprintable():
            fail(f"{param}.{key} must be at most {MAX_TAG_VALUE_CHARS} printable characters", param)
    return dict(value)


def end_user_and_tags(dialect: str, payload: Any) -> tuple[str | None, dict[str, str]]:
    """(end user, tags) of a parsed request's body; (None, {}) for a dialect whose bodies name neither."""
    if not isinstance(payload, dict):
        return None, {}
    if dialect in OPENAI_BODIES:
        return _end_user(payload.get("user"), "user"), _tags(payload.get("metadata"), "metadata")
    if dialect == "anthropic":
        metadata = payload.get("metadata")
        if metadata is None:
            return None, {}
        if not isinstance(metadata, dict):
            fail("metadata must be an object", "metadata")
        return _end_user(metadata.get("user_id"), "metadata.user_id"), {}
    return None, {}
