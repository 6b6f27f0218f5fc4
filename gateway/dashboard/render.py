"""How the dashboard's templates show numbers: counts with separators, money from micro-units, times in
the view's zone, and the series as table rows (every chart has a table).

Numbers are written in English here and carry their value (`data-n`, `data-money`): dashboard.js rewrites
them in the browser's locale (`Intl.NumberFormat` with the browser's language, the one it sends as
Accept-Language first), so a reader in Germany sees "1.234.567" and "1.234,57 $"."""

from __future__ import annotations

import functools
import hashlib
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from urllib.parse import quote

import msgspec
from jinja2 import pass_context
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.template import TemplateConfig
from markupsafe import Markup, escape

from billing.insights.histograms import EXACT_UP_TO
from billing.insights.overview import Overview, Series
from billing.insights.timings import Timings
from billing.store.latency_rollup import RELATIVE_ERROR
from billing.timebuckets import zone
from billing.usage import micros_to_decimal
from gateway.dashboard.access import masked_token
from gateway.dashboard.filters import zone_or_utc

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
CENT_MICROS = 10_000


class SeriesRow(msgspec.Struct):
    label: str
    requests: int
    tokens: int
    cost_micros: int
    rate_limited: int  # 429s of rate limits, concurrency caps, full queues
    budget_refused: int  # refused by a budget (429 or 402 by dialect): charted apart
    cold_starts: int
    cold_wait_mean_ms: float | None  # None: no request waited in this bucket
    cold_wait_max_ms: float | None


def count(value: int) -> Markup:
    return Markup(f'<span data-n="{int(value)}">{value:,}</span>')


def money(micros: int) -> Markup:
    """Dollars to the cent as people read them ("$1,234.57"); an amount under a cent (most single requests) to
    two significant digits ("$0.00014"), never a bare "<$0.01"; the exact amount in the title."""
    exact = micros_to_decimal(micros)
    if 0 < abs(micros) < CENT_MICROS:
        amount = Decimal(exact)
        step = max(Decimal(1).scaleb(amount.adjusted() - 1), Decimal("0.000001"))  # 2 digits; a micro at least
        shown = f"${amount.quantize(step, ROUND_HALF_UP).normalize():f}"
    else:
        shown = f"${Decimal(exact).quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    return Markup(f'<span class="money" title="${exact}" data-money="{exact}">{escape(shown)}</span>')


def share(fraction: float, digits: int = 0) -> Markup:
    """A share as a percentage ("117 %", "0.25 %" with `digits`); dashboard.js writes it in the reader's locale
    ("117 %" in German, "117%" in English)."""
    return Markup(f'<span data-share="{fraction:.{digits + 4}f}" data-digits="{digits}">'
                  f'{fraction * 100:,.{digits}f} %</span>')


def ms(value: float | None) -> Markup:
    return Markup("–") if value is None else Markup(f'<span data-n="{round(value)}">{value:,.0f}</span> ms')


def rate(value: float | None) -> Markup:
    """Tokens per second, to a tenth."""
    return Markup("–") if value is None else Markup(f'<span data-n="{value:.1f}" data-digits="1">{value:,.1f}</span>')


def change(current: float, previous: float) -> Markup:
    """The change from the previous period, as a signed percentage ("+12.5 %", localized as every share), or why
    there is none."""
    if previous == 0:
        return Markup("new" if current else "no change")
    fraction = (current - previous) / previous
    return Markup(f'<span data-share="{fraction:.5f}" data-digits="1" data-signed>{fraction * 100:+,.1f} %</span>')


class Comparison(msgspec.Struct):
    """A tile's number now and in the previous period of the same length."""

    name: str
    previous: float
    change: Markup


def comparisons(o: Overview) -> list[Comparison]:
    """The tiles compared with the previous period: requests, tokens, cost, failed requests."""
    def pair(name: str, now: float, before: float) -> Comparison:
        return Comparison(name, before, change(now, before))

    t, p = o.totals, o.previous
    return [pair("requests", t.requests, p.requests),
            pair("tokens", t.prompt_tokens + t.completion_tokens, p.prompt_tokens + p.completion_tokens),
            pair("cost", t.cost_micros, p.cost_micros), pair("errors", t.errors + t.rejected, p.errors + p.rejected)]


def when(unix: float, tz: str, *, seconds: bool = False) -> str:
    """A moment in the view's zone, as every table writes it; a request's own time to the second."""
    return datetime.fromtimestamp(unix, zone(tz)).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


MAX_TABLE_ROWS = 400  # buckets a table lists in full (90 days by day, 16 days by hour)
TRIMMED_ROWS = 168  # past that, the latest week of hours (the charts draw every bucket)


def table_rows(series: Series, step: int = 1) -> range:
    """The buckets the tables under the charts list: every one, or the latest week's past MAX_TABLE_ROWS (TRIMMED_ROWS
    hours, in buckets of `step` hours). A table of 2,160 hours × every model made the 90-day hourly page 200,000
    elements that took half a minute to lay out, and nobody reads it: the charts draw them all, the CSV holds every
    record."""
    count = len(series.buckets)
    return range(count) if count <= MAX_TABLE_ROWS else range(max(0, count - TRIMMED_ROWS // step), count)


def series_rows(series: Series, rows: range | None = None) -> list[SeriesRow]:
    """One row per bucket (of `rows`: all by default), summed over the models."""
    rows_out = []
    for i in (rows if rows is not None else range(len(series.buckets))):
        bucket = series.buckets[i]
        models = series.by_group
        rows_out.append(SeriesRow(bucket.label, sum(m.requests[i] for m in models),
                              sum(m.prompt_tokens[i] + m.completion_tokens[i] for m in models),
                              sum(m.cost_micros[i] for m in models), series.rate_limited[i], series.budget_refused[i],
                              series.cold_starts[i],
                              _mean_wait(series, i), series.cold_start_ms_max[i]))
    return rows_out


def _mean_wait(series: Series, i: int) -> float | None:
    return series.cold_start_ms_total[i] / series.cold_starts[i] if series.cold_starts[i] else None


class ColdStarts(msgspec.Struct):
    count: int
    mean_ms: float | None
    max_ms: float | None


def cold_starts(series: Series) -> ColdStarts:
    """The window's cold starts: how many requests waited for their endpoint, how long on average, the longest."""
    count = sum(series.cold_starts)
    longest = [m for m in series.cold_start_ms_max if m is not None]
    return ColdStarts(count, sum(series.cold_start_ms_total) / count if count else None,
                      max(longest) if longest else None)


def _by_group(series: Series, per_group, unserved: set[str]) -> list[dict]:
    """Per group, its own value in each bucket: the browser stacks them for the fills, and the legend reads
    each group's own. The names nobody serves (`unserved`) are one group."""
    lines = [{"label": m.key, "values": per_group(m)} for m in series.by_group if m.key not in unserved]
    folded = [per_group(m) for m in series.by_group if m.key in unserved]
    if folded:
        lines.append({"label": f"{NOT_SERVED} ({len(folded)} names)",
                      "values": [sum(v or 0 for v in bucket) for bucket in zip(*folded, strict=True)]})
    return lines


NOT_SERVED = "models nobody serves"


def unserved_models(series: Series, served: set[str] | None) -> set[str]:
    """The model names of the view that no endpoint serves and that never ran a token: what callers typed (a
    typo, another provider's name) and were refused for. A model that did run (an endpoint since removed) keeps
    its own line. None: the served models are not known here (nothing is folded)."""
    if served is None or series.group_by != "model":
        return set()
    return {m.key for m in series.by_group
            if m.key not in served and not any(m.prompt_tokens) and not any(m.compute_tokens)}


ALL_MODELS = "all models"
PERCENTILES = ("p50", "p95", "p99")


def _by_model(timed: Timings, per_line, unserved: set[str] = frozenset()) -> list[dict]:
    """One line per model (its own value in each bucket), and all models together when there are several (first:
    drawn under the models' lines). A name nobody serves draws no line: its requests were refusals."""
    lines = [{"label": m.model, "values": per_line(m)} for m in timed.by_model if m.model not in unserved]
    if len(lines) != 1:
        lines.insert(0, {"label": ALL_MODELS, "values": per_line(timed), "dash": True})
    return lines


def _tenths(values, digits: int = 1) -> list[float | None]:
    """Values as the charts can show them (a tenth of a millisecond; a hundredth of a token a second): no pixel
    and no legend shows more, and the 90-day hourly page's JSON is half as long."""
    return [None if v is None else round(v, digits) for v in values]


def _percentiles(timed: Timings, column: str, unserved: set[str]) -> dict[str, list[dict]]:
    """Per percentile (the chart's selector picks one), a line per model."""
    return {name: _by_model(timed, lambda m, name=name: _tenths(getattr(p, name) for p in getattr(m, column)),
                            unserved)
            for name in PERCENTILES}


def chart_data(o: Overview, served: set[str] | None = None) -> dict:
    """What the charts draw; the tables under them hold the same numbers. `served`: the models the gateway serves
    (the names nobody serves are folded into one group)."""
    series, timed = o.series, o.timings
    unserved = unserved_models(series, served)
    return {"x": [b.start for b in series.buckets], "tz": series.tz,
            "requests": _by_group(series, lambda m: m.requests, unserved),
            "errors": [{"label": status, "values": values} for status, values in timed.errors_by_status.items()],
            "latency": _percentiles(timed, "latency_ms", unserved), "ttft": _percentiles(timed, "ttft_ms", unserved),
            "speed": _by_model(timed, lambda m: _tenths(m.output_tokens_per_s, 2), unserved),
            "tokens": _by_group(series, lambda m: [p + c for p, c in zip(m.prompt_tokens, m.completion_tokens,
                                                                           strict=True)], unserved),
            "cost": _by_group(series, lambda m: [c / 1e6 for c in m.cost_micros], unserved),
            "events": [{"label": "rate-limited (429)", "values": series.rate_limited},
                       {"label": "budget refusals", "values": series.budget_refused},
                       {"label": "cold starts", "values": series.cold_starts}],
            "waits": [{"label": "mean cold-start wait",
                       "values": _tenths(_mean_wait(series, i) for i in range(len(series.buckets)))},
                      {"label": "longest cold-start wait", "values": _tenths(series.cold_start_ms_max)}],
            "units": UNITS}


# what each chart's values are: the legend under the pointer writes them rounded, with this unit
UNITS = {"requests": "requests", "errors": "requests", "events": "requests", "latency": "ms", "ttft": "ms",
         "waits": "ms", "speed": "tok/s", "tokens": "tokens", "cost": "USD"}


@pass_context
def page_zone(context) -> str:
    """The zone of the page being drawn: its view's, else the page's own `tz`, else the URL's (UTC when refused)."""
    view = context.get("view")
    if view and not view.problem:
        return view.tz
    if context.get("tz"):
        return context["tz"]
    request = context.get("request")
    return zone_or_utc(request.query_params)[0] if request is not None else "UTC"


@pass_context
def zone_query(context) -> str:
    """"&tz=<zone>" for a link of this page when it is in a zone other than UTC, else "": every link of the bar
    and of the pages keeps the zone the reader chose."""
    tz = page_zone(context)
    return "" if tz == "UTC" else "&tz=" + quote(tz, safe="")


@functools.cache
def static_url(path: str) -> str:
    """A static file's URL with its content's digest (`?v=`): the file is cached for a year and a new version is a
    new URL, so no reader runs a stale script against a new page."""
    digest = hashlib.sha256((STATIC / path).read_bytes()).hexdigest()[:12]
    return f"/dashboard/static/{path}?v={digest}"


def request_value(view, name: str) -> str:
    """The first value of a view parameter, for a form field."""
    return next((v for k, v in view.params if k == name), "")


def _register(engine: JinjaTemplateEngine) -> None:
    env = engine.engine
    env.filters.update(count=count, money=money, share=share, ms=ms, rate=rate, when=when)
    env.globals.update(csrf_token=masked_token, static_url=static_url, table_rows=table_rows,
                       series_rows=series_rows, request_value=request_value, chart_data=chart_data,
                       zone_query=zone_query, page_zone=page_zone, cold_starts=cold_starts, comparisons=comparisons,
                       percentiles=PERCENTILES, percentile_error=RELATIVE_ERROR, exact_up_to=EXACT_UP_TO)


def template_config() -> TemplateConfig:
    return TemplateConfig(directory=TEMPLATES, engine=JinjaTemplateEngine, engine_callback=_register)
