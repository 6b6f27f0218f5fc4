"""Whole numbers in the dashboard's forms and headers, read strictly: ASCII digits 0-9 only.

Python's `str.isdigit()` is true for '²' or '٣', and `int()` takes '٣' (Arabic-Indic three) but raises on '²',
and on more than 4,300 digits: such a field was a 500. Here anything but a short run of ASCII digits is a 400
page that names the field."""

from __future__ import annotations

from common.errors import BadRequest

MAX_DIGITS = 15  # far above any value a field takes; the field's own range is checked where it is used


def ascii_whole(raw: str) -> int | None:
    """The number `raw` spells in ASCII digits (at most MAX_DIGITS), else None."""
    if raw.isascii() and raw.isdigit() and len(raw) <= MAX_DIGITS:
        return int(raw)
    return None


def whole_number(raw: str, field: str) -> int:
    """A form field that must be a whole number: BadRequest naming it otherwise."""
    value = ascii_whole(raw.strip())
    if value is None:
        raise BadRequest(f"{field} must be a whole number written with the digits 0-9 (got {raw[:40]!r}).",
                         param=field)
    return value
