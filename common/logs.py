"""structlog setup shared by the worker and the gateway: JSON lines in production, console for humans."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import msgspec
import structlog

# every log line goes through this: msgspec's encoder costs a fraction of json.dumps; a value
# it cannot encode is written as its repr, as structlog's own fallback does
_encoder = msgspec.json.Encoder(enc_hook=repr)


def _dumps(event: Any, **_options: Any) -> bytes:
    return _encoder.encode(event)


class UtcStamp:
    """structlog processor: `timestamp`, ISO 8601 in UTC with microseconds ("2026-11-24T13:05:09.041805Z"), the
    date and time of day formatted once per second. structlog's TimeStamper builds a datetime per line, and under
    load every request writes a line."""

    def __init__(self) -> None:
        self._second = (-1, "")  # (unix second, its formatted prefix): one tuple, so threads never see half

    def __call__(self, _logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        now = time.time()
        second, prefix = self._second
        if int(now) != second:
            second = int(now)
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, prefix)
        event_dict["timestamp"] = f"{prefix}.{min(int((now - second) * 1_000_000), 999_999):06d}Z"
        return event_dict


def configure_logging(fmt: str = "json", level: int = logging.INFO) -> None:
    renderer: structlog.typing.Processor
    output: structlog.BytesLoggerFactory | structlog.PrintLoggerFactory
    if fmt == "json":  # bytes straight to the stream: no str round trip, one write per line
        renderer, output = structlog.processors.JSONRenderer(_dumps), structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        renderer, output = structlog.dev.ConsoleRenderer(), structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    UtcStamp(), structlog.processors.format_exc_info,
                    renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=output,
        cache_logger_on_first_use=True)
    # one access-log line per request is ours; the HTTP client's own INFO line per call is noise
    logging.getLogger("httpx").setLevel(logging.WARNING)
