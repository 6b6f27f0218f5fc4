"""The dashboard's view of a URL: the range (24h, 7d, 30d, 90d or custom start/end), the zone and the
usage filters, read by the usage API's own parsers so a page and `GET /v1/usage` agree on every value; and
the query string that reproduces the view (links, the team switcher, CSV).

The zone (`tz`, UTC unless the local-time toggle put the browser's there) places the buckets, the times
shown and the days of a custom range: `start=2026-11-20` in Asia/Kolkata is that day's local midnight."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import msgspec

from billing.filters import Selection
from billing.params import (
    FILTER_PARAMS,
    UsageParamError,
    parse_filters,
    parse_granularity,
    parse_instant,
    parse_tz,
)
from billing.timebuckets import zone

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30), "90d": timedelta(days=90)}
DEFAULT_RANGE = "7d"
CUSTOM = "custom"
VIEW_PARAMS = ("range", "start", "end", "tz", "granularity", *FILTER_PARAMS)


class View(msgspec.Struct, frozen=True):
    range: str
    selection: Selection
    tz: str
    granularity: str
    params: list[tuple[str, str]]  # the view's own query parameters, team excluded, in URL order

    def query(self, **changes: str) -> str:
        """The query string of this view with `changes` applied (an empty value drops the parameter)."""
        kept = [(k, v) for k, v in self.params if k not in changes]
        return urlencode(kept + [(k, v) for k, v in changes.items() if v])


def _instant(query, param: str, tz: str, *, is_end: bool) -> datetime:
    """A custom bound; a date alone is a whole day of the view's zone."""
    moment = parse_instant(param, query[param], is_end=is_end)
    return moment.replace(tzinfo=zone(tz)) if len(query[param].strip()) == 10 else moment


def read_view(query, team_id: str | None, now: datetime | None = None) -> View:
    now = now or datetime.now(UTC)
    tz = parse_tz(query)
    chosen = query.get("range") or (CUSTOM if query.get("start") or query.get("end") else DEFAULT_RANGE)
    if chosen == CUSTOM:
        end = _instant(query, "end", tz, is_end=True) if query.get("end") else now
        start = _instant(query, "start", tz, is_end=False) if query.get("start") else end - RANGES["7d"]
        if end < start:
            raise UsageParamError("end", "end must not be before start")
    elif chosen in RANGES:
        start, end = now - RANGES[chosen], now
    else:
        raise UsageParamError("range", f"range must be one of {', '.join([*RANGES, CUSTOM])}; got {chosen!r}")
    selection = Selection(start.timestamp(), end.timestamp(), team_id, parse_filters(query))
    granularity = parse_granularity(query, selection, tz)
    params = [(k, v) for k, v in query.multi_items() if k in VIEW_PARAMS and v]
    return View(chosen, selection, tz, granularity, params)
