"""Hour, day, week and month buckets of UTC or of an IANA zone's local clock, right across DST changes.

The database groups rows by a key computed from each row's time: floor((time + offset) / size),
where `offset` is the zone's UTC offset in force at that time. The offset changes only at the
zone's transitions, so the window is cut into spans of constant offset and the SQL picks the span's
offset with a CASE over the transition instants (none for UTC). A group is then (key, span):
- a local day is one bucket even when a transition cuts it (23 or 25 hours long);
- a local hour that the clock repeats when it falls back is two buckets (same label, two offsets),
  and the hour the clock skips when it springs forward has no bucket.

Weeks (Monday to Monday) and months are calendar periods of the zone: their edges are the local
midnights that start them, computed here, and the SQL places a row by a CASE over those edges.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from storage.sql_dialect import SqlDialect

Granularity = Literal["hour", "day", "week", "month"]
GRANULARITIES: tuple[str, ...] = ("hour", "day", "week", "month")
CALENDAR = ("week", "month")  # periods of uneven length: bucketed by their edges
SIZES = {"hour": 3600, "day": 86400}
_PROBE = 6 * 3600  # zones change offset at most once between probes this far apart
_LONG_PROBE = 86400  # for windows of years, where probing every 6 h would cost more than the query
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")
_EPOCH_DAY = date(1970, 1, 1)


class ZoneError(ValueError):
    pass


def zone(name: str) -> ZoneInfo:
    """The IANA zone called `name`; ZoneError when there is none."""
    if len(name) > 64 or not _ZONE_NAME.fullmatch(name):
        raise ZoneError(f"{name!r} is not an IANA time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ZoneError(f"unknown time zone {name!r}") from None


class Bucket(msgspec.Struct, frozen=True):
    start: float  # unix seconds: the bucket's first instant
    end: float  # unix seconds, exclusive
    label: str  # day: "2025-03-09" (local date); hour: "2025-03-09T01:00:00-05:00" (local clock + offset)


class Span(msgspec.Struct, frozen=True, array_like=True):
    start: float  # -inf for the first span
    end: float  # +inf for the last span
    offset: int  # seconds: local clock = UTC + offset


def _offset(tz: ZoneInfo, t: float) -> int:
    offset = datetime.fromtimestamp(t, tz).utcoffset()
    assert offset is not None  # an aware datetime's
    return int(offset.total_seconds())


def offset_spans(tz: ZoneInfo, start: float, end: float) -> list[Span]:
    """The window cut at each of the zone's offset changes inside it."""
    if tz.key == "UTC":
        return [Span(-math.inf, math.inf, 0)]
    step = _PROBE if end - start <= 2 * 366 * 86400 else _LONG_PROBE
    cuts: list[tuple[int, int]] = []  # (transition instant, offset from then on)
    previous, current = math.floor(start), _offset(tz, math.floor(start))
    probe = previous
    while probe < end:
        probe = min(probe + step, math.ceil(end))
        offset = _offset(tz, probe)
        if offset != current:
            lo, hi = previous, probe  # offset(lo) == current != offset(hi): find the first second of the new one
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if _offset(tz, mid) == current else (lo, mid)
            cuts.append((hi, offset))
            current = offset
        previous = probe
    edges = [-math.inf, *(t for t, _ in cuts), math.inf]
    offsets = [_offset(tz, math.floor(start)), *(o for _, o in cuts)]
    return [Span(edges[i], edges[i + 1], offsets[i]) for i in range(len(offsets))]


class Bucketing:
    """How one query buckets time: granularity, zone and the window's offset spans."""

    def __init__(self, granularity: Granularity, tz_name: str, start: float, end: float, step: int = 1) -> None:
        """`step`: hours per bucket (hours only): a long hourly view drawn at a chart's width (each bucket starts
        at a local hour that is a multiple of `step` hours since the epoch, on the local clock)."""
        if step != 1 and (granularity != "hour" or not 1 <= step <= 24):
            raise ValueError("only hours come in steps, of 1 to 24")
        self.granularity = granularity
        self.tz = zone(tz_name)
        self.start, self.end, self.step = start, end, step
        if granularity in CALENDAR:
            self.size, self.spans = 0, []
            self.edges = self._calendar_edges()
        else:
            self.size, self.edges = SIZES[granularity] * step, []
            self.spans = offset_spans(self.tz, start, end)

    def sql(self, dialect: SqlDialect, column: str = "time") -> tuple[str, str]:
        """(key, span) expressions over a time column; their values go to `bucket`. Two rows share a
        bucket exactly when they share (key, span): the span tells apart only hours (a repeated hour)."""
        if self.edges:
            inner = self.edges[1:-1]
            if not inner:
                return "0", "0"
            cases = " ".join(f"WHEN {column} < {edge!r} THEN {i}" for i, edge in enumerate(inner))
            return f"CASE {cases} ELSE {len(inner)} END", "0"
        if len(self.spans) == 1:
            offset = self.spans[0].offset
            shifted = f"{column} + {offset}" if offset else column
            return dialect.floor_div(shifted, self.size), "0"
        edges = [s.end for s in self.spans[:-1]]
        offset_case = " ".join(f"WHEN {column} < {int(t)} THEN {s.offset}"
                               for t, s in zip(edges, self.spans, strict=False))
        span_case = " ".join(f"WHEN {column} < {int(t)} THEN {i}" for i, t in enumerate(edges))
        key = dialect.floor_div(f"{column} + CASE {offset_case} ELSE {self.spans[-1].offset} END", self.size)
        span = f"CASE {span_case} ELSE {len(edges)} END" if self.granularity == "hour" else "0"
        return key, span

    def aligned(self, period: int) -> bool:
        """Whether every bucket is made of whole `period`s of UTC (so a rollup of them can fill it)."""
        if self.edges:
            return all(edge % period == 0 for edge in self.edges[1:-1])
        return self.size % period == 0 and all(
            s.offset % period == 0 and all(math.isinf(edge) or edge % period == 0 for edge in (s.start, s.end))
            for s in self.spans)

    def bucket(self, key: int, span: int) -> Bucket:
        if self.edges:
            i = int(key)
            first = datetime.fromtimestamp(self.edges[i], self.tz).date()
            label = first.isoformat() if self.granularity == "week" else first.isoformat()[:7]
            return Bucket(self.edges[i], self.edges[i + 1], label)
        if self.granularity == "day":
            day = _EPOCH_DAY + timedelta(days=int(key))
            return Bucket(self._local_midnight(day), self._local_midnight(day + timedelta(days=1)), day.isoformat())
        s = self.spans[span]
        wall = int(key) * self.size
        start, end = max(wall - s.offset, s.start), min(wall - s.offset + self.size, s.end)
        local = datetime.fromtimestamp(wall, UTC).replace(tzinfo=None).isoformat()
        return Bucket(float(start), float(end), f"{local}{_offset_text(s.offset)}")

    def all(self) -> list[Bucket]:
        """Every bucket that overlaps the window, in time order (empty ones included)."""
        if self.edges:
            return [self.bucket(i, 0) for i in range(len(self.edges) - 1)]
        buckets: dict[str, Bucket] = {}
        for index, s in enumerate(self.spans):
            lo, hi = max(s.start, self.start), min(s.end, self.end)
            if lo >= hi:
                continue
            first = int((lo + s.offset) // self.size)  # `//` is exact on floats, as the SQL's floor_div
            upto = (hi + s.offset) // self.size
            last = int(upto) - 1 if upto * self.size == hi + s.offset else int(upto)
            for key in range(first, last + 1):
                b = self.bucket(key, index)
                buckets.setdefault(f"{b.label}@{b.start}", b)
        return sorted(buckets.values(), key=lambda b: b.start)

    def count(self) -> int:
        """How many buckets `all()` returns, at most (cheap: no buckets built)."""
        if self.edges:
            return len(self.edges) - 1
        return math.ceil((self.end - self.start) / self.size) + len(self.spans) + 1

    def _calendar_edges(self) -> list[float]:
        """The local midnights starting each week (Monday) or month that overlaps the window, and the one after."""
        day = datetime.fromtimestamp(self.start, self.tz).date()
        day = day - timedelta(days=day.weekday()) if self.granularity == "week" else day.replace(day=1)
        edges = [self._local_midnight(day)]
        while edges[-1] < self.end or len(edges) < 2:
            if self.granularity == "week":
                day += timedelta(days=7)
            else:
                day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
            edges.append(self._local_midnight(day))
        return edges

    def _local_midnight(self, day: date) -> float:
        # fold=0: a midnight the clock skips maps to the transition itself, the first instant of the day
        return datetime(day.year, day.month, day.day, tzinfo=self.tz).timestamp()


def _offset_text(seconds: int) -> str:
    sign = "+" if seconds >= 0 else "-"
    hours, rest = divmod(abs(seconds), 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}"
