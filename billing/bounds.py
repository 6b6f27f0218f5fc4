"""How long each string the ledger stores may be: one place, applied to every record before it is written.

A record is metadata (ids, names, codes), never text a caller chose freely, yet a caller can name anything as
its model (a 404 for an unknown model is still recorded, attributed to the name it sent). Unbounded, one such
field made a frame larger than the log's reader takes. Longer values are cut and end in `TRIMMED`, so a reader
sees the value was cut. Documented in docs/api.md ("What the usage ledger stores") and billing/README.md.
"""

from __future__ import annotations

import msgspec

from billing.records import UsageRecord

TRIMMED = "…"
MAX_ID_CHARS = 128  # request, team, key, user and worker ids (the gateway's own are far shorter)
MAX_NAME_CHARS = 256  # model and adapter names (the usage API's filters match at most 256 characters)
MAX_WORD_CHARS = 64  # dialect, route, error code: words of the gateway's own vocabulary

FIELD_BOUNDS = {
    "request_id": MAX_ID_CHARS, "team_id": MAX_ID_CHARS, "key_id": MAX_ID_CHARS, "user_id": MAX_ID_CHARS,
    "worker_id": MAX_ID_CHARS, "client_request_id": MAX_ID_CHARS, "model": MAX_NAME_CHARS,
    "adapter": MAX_NAME_CHARS, "dialect": MAX_WORD_CHARS,
    "route": MAX_WORD_CHARS, "error_code": MAX_WORD_CHARS,
    # a batch's id is the gateway's own; a line's custom_id is the caller's (OpenAI's batch files and Anthropic's
    # Message Batches: at most 64 characters there), kept whole up to a model name's bound
    "batch_id": MAX_ID_CHARS, "custom_id": MAX_NAME_CHARS,
    # the caller's end user (OpenAI's `user`, Anthropic's `metadata.user_id`: at most 256 characters there)
    "end_user": MAX_NAME_CHARS,
}
# a record's tags (OpenAI's `metadata` bounds): the gateway refuses more with a 400; the ledger keeps to them too
MAX_TAGS = 16
MAX_TAG_KEY_CHARS = 64
MAX_TAG_VALUE_CHARS = 512
BOUNDED_APART = {"tags"}
# the most bytes a record's strings take in UTF-8 (4 bytes a character at most): what a frame can grow to
MAX_STRING_BYTES = 4 * (sum(FIELD_BOUNDS.values()) + MAX_TAGS * (MAX_TAG_KEY_CHARS + MAX_TAG_VALUE_CHARS))


def trim(value: str, limit: int) -> str:
    return value if len(value) <= limit else value[:limit - len(TRIMMED)] + TRIMMED


def bounded(rec: UsageRecord) -> UsageRecord:
    """The record with every string field within its bound (the record itself when all are)."""
    changes: dict[str, object] = {name: trim(value, limit) for name, limit in FIELD_BOUNDS.items()
                                 if isinstance(value := getattr(rec, name), str) and len(value) > limit}
    if len(rec.tags) > MAX_TAGS or any(len(k) > MAX_TAG_KEY_CHARS or len(v) > MAX_TAG_VALUE_CHARS
                                       for k, v in rec.tags.items()):
        changes["tags"] = {trim(k, MAX_TAG_KEY_CHARS): trim(v, MAX_TAG_VALUE_CHARS)
                           for k, v in list(rec.tags.items())[:MAX_TAGS]}
    return msgspec.structs.replace(rec, **changes) if changes else rec


def _every_string_field_is_bounded() -> None:
    strings = {f.name for f in msgspec.structs.fields(UsageRecord) if "str" in str(f.type)}
    missing = strings - FIELD_BOUNDS.keys() - BOUNDED_APART
    if missing:  # a new string field must get a bound here before it can reach the log
        raise TypeError(f"UsageRecord fields without a bound in billing/bounds.py: {sorted(missing)}")


_every_string_field_is_bounded()
