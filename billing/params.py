"""Query-string parsing for the usage API and the dashboards: every bad value becomes a
UsageParamError naming its parameter.

Filters repeat to select several values (`?model=a&model=b`); an empty value is no filter;
`user_id=-` (NO_USER) selects requests made with a service key (no user), `adapter=-` requests to
the base model (no LoRA adapter)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast, overload

from billing.bounds import MAX_TAG_KEY_CHARS, MAX_TAG_VALUE_CHARS
from billing.filters import Filters, Selection
from billing.insights.overview import bucketing_for
from billing.insights.requests import MAX_PAGE_SIZE, Cursor, CursorError
from billing.records import STATUSES
from billing.timebuckets import GRANULARITIES, Granularity, ZoneError, zone
from common.errors import BadRequest

# the query string: Litestar's multi-dict (getall gives a repeated parameter's values), or a plain dict
Query = Mapping[str, Any]

DEFAULT_WINDOW = timedelta(days=30)
HOURLY_UP_TO = timedelta(days=3)  # the default series granularity: hours for windows this short, else days
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)  # bounds the work a window's time-zone buckets take
MAX_FILTER_VALUES = 50
MAX_VALUE_LENGTH = 256
BASE_MODEL = ""  # the adapter of a request without one
FILTER_PARAMS = {"model": "models", "key_id": "key_ids", "user_id": "user_ids", "dialect": "dialects",
                 "status": "statuses", "adapter": "adapters", "end_user": "end_users"}
TAG_PARAM = "tag"  # `tag=env=prod`: a record's tag pair (key, then its value after the first "="); each one given
MAX_TAG_FILTERS = 8


class UsageParamError(BadRequest):
    def __init__(self, param: str, message: str, code: str = "invalid_parameter") -> None:
        super().__init__(message, param=param, code=code)


def parse_instant(param: str, raw: str, *, is_end: bool) -> datetime:
    """A date is a whole UTC day (an end date includes its day); a datetime without an offset is UTC."""
    text = raw.strip()
    try:
        if len(text) == 10:
            day = datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
            moment = day + timedelta(days=1) if is_end else day
        else:
            moment = datetime.fromisoformat(text)
            moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise UsageParamError(param, f"{param} must be an ISO-8601 date or datetime (UTC), got {raw!r}") from None
    if not EARLIEST <= moment <= LATEST:
        raise UsageParamError(param, f"{param} must lie between {EARLIEST.date()} and {LATEST.date()}")
    return moment


def parse_window(query: Query, now: datetime | None = None) -> tuple[datetime, datetime]:
    now = now or datetime.now(UTC)
    raw_start, raw_end = query.get("start"), query.get("end")
    end = parse_instant("end", raw_end, is_end=True) if raw_end else now
    start = parse_instant("start", raw_start, is_end=False) if raw_start else max(end - DEFAULT_WINDOW, EARLIEST)
    if end < start:
        raise UsageParamError("end", "end must not be before start")
    return start, end


@overload
def parse_choice(query: Query, param: str, allowed: tuple[str, ...], default: str) -> str: ...
@overload
def parse_choice(query: Query, param: str, allowed: tuple[str, ...], default: None) -> str | None: ...
def parse_choice(query: Query, param: str, allowed: tuple[str, ...], default: str | None) -> str | None:
    raw: str | None = query.get(param)
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise UsageParamError(param, f"{param} must be one of {', '.join(allowed)}; got {raw!r}")
    return raw


def _check_value(param: str, value: str) -> str:
    if len(value) > MAX_VALUE_LENGTH or not value.isprintable():
        raise UsageParamError(param, f"{param} values must be printable and at most {MAX_VALUE_LENGTH} characters")
    return value


def parse_team(query: Query) -> str | None:
    raw = query.get("team_id")
    return _check_value("team_id", raw) if raw else None


def _values(query: Query, param: str) -> list[str]:
    getall = getattr(query, "getall", None)
    raw = getall(param, []) if getall is not None else ([query[param]] if query.get(param) is not None else [])
    return [v for v in raw if v != ""]


def parse_filters(query: Query) -> Filters:
    found: dict[str, tuple[str, ...]] = {}
    for param, field in FILTER_PARAMS.items():
        values = _values(query, param)
        if len(values) > MAX_FILTER_VALUES:
            raise UsageParamError(param, f"{param} may be given at most {MAX_FILTER_VALUES} times")
        for value in values:
            _check_value(param, value)
            if param == "status" and value not in STATUSES:
                raise UsageParamError(param, f"status must be one of {', '.join(STATUSES)}; got {value!r}")
        if param == "adapter":
            values = [BASE_MODEL if v == "-" else v for v in values]
        if values:
            found[field] = tuple(dict.fromkeys(values))
    return Filters(**found, tags=_tags(query))


def _tags(query: Query) -> tuple[tuple[str, str], ...]:
    """The `tag` parameters as (key, value) pairs, each bounded as the gateway bounds a request's tags."""
    values = _values(query, TAG_PARAM)
    if len(values) > MAX_TAG_FILTERS:
        raise UsageParamError(TAG_PARAM, f"{TAG_PARAM} may be given at most {MAX_TAG_FILTERS} times")
    pairs = []
    for value in values:
        key, equals, tag = value.partition("=")
        if not equals or not 1 <= len(key) <= MAX_TAG_KEY_CHARS or len(tag) > MAX_TAG_VALUE_CHARS \
                or not value.isprintable():
            raise UsageParamError(TAG_PARAM, f"{TAG_PARAM} is key=value: a key of 1 to {MAX_TAG_KEY_CHARS} and a value "
                                  f"of at most {MAX_TAG_VALUE_CHARS} printable characters (got {value[:80]!r})")
        pairs.append((key, tag))
    return tuple(dict.fromkeys(pairs))


def parse_selection(query: Query, team_id: str | None, now: datetime | None = None) -> Selection:
    start, end = parse_window(query, now)
    return Selection(start.timestamp(), end.timestamp(), team_id, parse_filters(query))


def parse_tz(query: Query) -> str:
    raw = query.get("tz")
    if not raw:
        return "UTC"
    try:
        return zone(raw).key
    except ZoneError as exc:
        raise UsageParamError("tz", f"tz: {exc}") from None


def parse_limit(query: Query, default: int) -> int:
    raw = query.get("limit")
    if raw is None or raw == "":
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise UsageParamError("limit", f"limit must be an integer, got {raw[:40]!r}") from None
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise UsageParamError("limit", f"limit must be between 1 and {MAX_PAGE_SIZE}, got {limit}")
    return limit


def parse_cursor(query: Query, *, newest_first: bool) -> Cursor | None:
    raw = query.get("cursor")
    if not raw:
        return None
    try:
        return Cursor.decode(raw, newest_first)
    except CursorError as exc:
        raise UsageParamError("cursor", f"cursor: {exc}") from None


def parse_granularity(query: Query, selection: Selection, tz: str) -> str:
    """`granularity` (hour or day; by default hours for windows up to 3 days), refused when the
    window would have too many buckets."""
    default = "hour" if selection.end - selection.start <= HOURLY_UP_TO.total_seconds() else "day"
    granularity = parse_choice(query, "granularity", GRANULARITIES, default)
    try:
        bucketing_for(selection, cast(Granularity, granularity), tz)  # one of GRANULARITIES
    except ValueError as exc:
        raise UsageParamError("granularity", f"granularity: {exc}") from None
    return granularity
