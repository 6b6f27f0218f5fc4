"""Query-string parsing for the usage API: every bad value becomes a UsageParamError naming it."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from common.errors import BadRequest

DEFAULT_WINDOW = timedelta(days=30)


class UsageParamError(BadRequest):
    def __init__(self, param: str, message: str, code: str = "invalid_parameter") -> None:
        super().__init__(message, param=param, code=code)


def parse_instant(param: str, raw: str, *, is_end: bool) -> datetime:
    """A date is a whole UTC day (an end date includes its day); a datetime without an offset is UTC."""
    text = raw.strip()
    try:
        if len(text) == 10:
            day = datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
            return day + timedelta(days=1) if is_end else day
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageParamError(param, f"{param} must be an ISO-8601 date or datetime (UTC), got {raw!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def parse_window(query, now: datetime | None = None) -> tuple[datetime, datetime]:
    now = now or datetime.now(UTC)
    raw_start, raw_end = query.get("start"), query.get("end")
    end = parse_instant("end", raw_end, is_end=True) if raw_end else now
    start = parse_instant("start", raw_start, is_end=False) if raw_start else end - DEFAULT_WINDOW
    if end < start:
        raise UsageParamError("end", "end must not be before start")
    return start, end


def parse_choice(query, param: str, allowed: tuple[str, ...], default: str | None) -> str | None:
    raw = query.get(param)
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise UsageParamError(param, f"{param} must be one of {', '.join(allowed)}; got {raw!r}")
    return raw
