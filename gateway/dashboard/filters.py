"""The dashboard's view of a URL: the range (24h, 7d, 30d, 90d or custom start/end), the zone and the
usage filters, read by the usage API's own parsers so a page and `GET /v1/usage` agree on every value; and
the query string that reproduces the view (links, the team switcher, CSV).

`group_by` (model, key, user, dialect, endpoint, adapter) splits the over-time charts; `granularity` buckets
them by hour, day, week (from Monday) or month, in the zone.

The zone (`tz`, UTC unless the local-time toggle put the browser's there) places the buckets, the times
shown and the days of a custom range: `start=2026-11-20` in Asia/Kolkata is that day's local midnight."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import msgspec

from billing.filters import Selection
from billing.insights.overview import SERIES_GROUPS
from billing.ledger import Ledger
from billing.params import (
    FILTER_PARAMS,
    TAG_PARAM,
    UsageParamError,
    parse_choice,
    parse_filters,
    parse_granularity,
    parse_instant,
    parse_tz,
)
from billing.records import STATUSES
from billing.timebuckets import GRANULARITIES, zone
from billing.usage import UsageQuery

RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30), "90d": timedelta(days=90)}
DEFAULT_RANGE = "7d"
CUSTOM = "custom"
VIEW_PARAMS = ("range", "start", "end", "tz", "granularity", "group_by", *FILTER_PARAMS, TAG_PARAM)
GROUPS = tuple(SERIES_GROUPS)
DEFAULT_GROUP = "model"
MAX_CHOICES = 200  # a select of more would not be read; the URL still takes any value


class Choices(msgspec.Struct, frozen=True):
    """What the filter form offers: the models, keys, users and dialects the team used in the window (whatever
    the filters), the statuses a record can have, the buckets and the groups of the charts."""

    models: list[str]
    key_ids: list[str]
    user_ids: list[str]  # "-": service keys
    dialects: list[str]
    statuses: tuple[str, ...] = STATUSES
    granularities: tuple[str, ...] = GRANULARITIES
    groups: tuple[str, ...] = GROUPS


async def filter_choices(ledger: Ledger, view: View) -> Choices:
    window = view.selection

    async def used(group: str) -> list[str]:
        report = await ledger.usage(UsageQuery(window.start, window.end, window.team_id, group))
        busiest = sorted(report.rows, key=lambda row: -row.requests)[:MAX_CHOICES]
        return sorted(row.key for row in busiest)

    return Choices(*await asyncio.gather(used("model"), used("key"), used("user"), used("dialect")))


class View(msgspec.Struct, frozen=True):
    """What the page shows; `problem` is a parameter the page refused (the form shows it at its field)."""

    range: str
    selection: Selection
    tz: str
    granularity: str
    params: list[tuple[str, str]]  # the view's own query parameters, team excluded, in URL order
    problem: UsageParamError | None = None
    group_by: str = DEFAULT_GROUP  # what the over-time charts are split by

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
    group_by = parse_choice(query, "group_by", GROUPS, DEFAULT_GROUP)
    return View(chosen, selection, tz, granularity, _params(query), group_by=group_by)


def _params(query) -> list[tuple[str, str]]:
    return [(k, v) for k, v in query.multi_items() if k in VIEW_PARAMS and v]


def zone_or_utc(query) -> tuple[str, str | None]:
    """The view's zone (the bar's links carry it) for a page that shows times but no window of usage; UTC, and
    why, when the zone is refused."""
    try:
        return parse_tz(query), None
    except UsageParamError as exc:
        return "UTC", exc.message


def read_view_or_problem(query, team_id: str | None, now: datetime | None = None) -> View:
    """The view; or, when a parameter is refused, the default window with the values as typed and the
    refusal, so the page can say at the field what is wrong instead of answering a bare error."""
    try:
        return read_view(query, team_id, now)
    except UsageParamError as problem:
        now = now or datetime.now(UTC)
        window = Selection((now - RANGES[DEFAULT_RANGE]).timestamp(), now.timestamp(), team_id)
        typed_tz = query.get("tz") or "UTC"
        return View(query.get("range") or DEFAULT_RANGE, window, typed_tz, "day", _params(query), problem)
