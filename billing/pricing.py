"""Per-model prices from a TOML file, re-read when the file changes, with the history kept so a
request is priced by what was in force when it arrived, not when it finished.

The gateway's `pricing_file` (prices are integer micro-units per million tokens; the file may be the
gateway's whole config file, so the prices sit under `[pricing]`)::

    [pricing.models."HuggingFaceTB/SmolLM2-135M-Instruct"]
    input = 150000
    output = 600000
    cached_input = 75000            # prompt tokens the prefix cache supplied (default: the input price; at most it)
    batch_discount_percent = 50     # off the whole cost of a batch line (default 0; 0-100), as OpenAI and Anthropic

    [pricing.models.default]        # any model not listed; without it unknown models cost zero
    input = 100000
    output = 400000

A file that prices nothing, a `[models]` table outside `[pricing]`, or an unknown key under `[pricing]` is
refused: each would price every request at $0 without a word.
"""

from __future__ import annotations

import bisect
import os
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from billing.records import Price

log = structlog.get_logger(__name__)

DEFAULT = "default"
ZERO = Price(0, 0)
_MAX_VERSIONS = 256  # requests outlive a handful of reloads at most; keep a generous tail


class PricingError(ValueError):
    pass


_FIELDS = ("input", "output", "cached_input", "batch_discount_percent")
MAX_PRICE_MICROS = 10**15  # a billion currency units per million tokens: anything larger is a typo (and an overflow)


def parse_prices(doc: Mapping[str, object]) -> dict[str, Price]:
    models = doc.get("models", {})
    if not isinstance(models, dict):
        raise PricingError("[models] must be a table")
    prices: dict[str, Price] = {}
    for name, entry in models.items():
        if not isinstance(entry, dict):
            raise PricingError(f"models.{name} must be a table")
        unknown = set(entry) - set(_FIELDS)
        if unknown:
            raise PricingError(f"models.{name}: unknown field(s) {sorted(unknown)}; known: {', '.join(_FIELDS)}")
        values: dict[str, Any] = {}  # int, or None for an unset cached_input
        for field in _FIELDS[:3]:
            value = entry.get(field, 0 if field != "cached_input" else None)
            # bool is an int subclass; floats would make money inexact
            if value is not None and (type(value) is not int or not 0 <= value <= MAX_PRICE_MICROS):
                raise PricingError(f"models.{name}.{field} must be an integer from 0 to {MAX_PRICE_MICROS} "
                                   "(micro-units per million tokens)")
            values[field] = value
        if values["cached_input"] is not None and values["cached_input"] > values["input"]:
            raise PricingError(f"models.{name}.cached_input ({values['cached_input']}) is above its input price "
                               f"({values['input']}): a cached token never costs more than a prefilled one")
        discount = entry.get("batch_discount_percent", 0)
        if type(discount) is not int or not 0 <= discount <= 100:
            raise PricingError(f"models.{name}.batch_discount_percent must be a whole percentage from 0 to 100")
        prices[name] = Price(values["input"], values["output"], values["cached_input"], discount)
    return prices


def section_of(doc: Mapping[str, object], section: str) -> Mapping[str, object]:
    """The `[section]` table of a larger file, refusing the misplacements that would silently price at $0."""
    if "models" in doc:
        raise PricingError(f"a [models] table outside [{section}]: prices go under [{section}.models.<name>]")
    found = doc.get(section)
    if not isinstance(found, dict) or not isinstance(found.get("models"), dict) or not found["models"]:
        raise PricingError(f"no [{section}.models.<name>] table: the file prices nothing")
    unknown = set(found) - {"models"}
    if unknown:
        raise PricingError(f"[{section}]: unknown key(s) {sorted(unknown)}; prices go under [{section}.models.<name>]")
    return found


class PricingTable:
    """Prices per model. `price(model, at)` is the hot-path lookup; it re-checks the file at most
    every `check_interval` seconds, and a broken file keeps the last good prices."""

    def __init__(self, path: Path | str | None = None, *, section: str | None = None,
                 prices: Mapping[str, Price] | None = None, check_interval: float = 1.0) -> None:
        self.path = Path(path) if path is not None else None
        self.section = section  # read `[section.models.*]` from a larger config file
        self.check_interval = check_interval
        self._stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        # parallel lists: effective-from unix time, prices
        self._since: list[float] = [0.0]
        self._tables: list[dict[str, Price]] = [dict(prices or {})]
        if self.path is not None:
            self.reload(force=True, strict=True)

    @classmethod
    def static(cls, prices: Mapping[str, Price]) -> PricingTable:
        return cls(prices=prices)

    @property
    def current(self) -> dict[str, Price]:
        return dict(self._tables[-1])

    def price(self, model: str, at: float | None = None) -> Price:
        if self.path is not None and time.monotonic() >= self._next_check:
            self.reload()
        index = len(self._since) - 1
        if at is not None and at < self._since[index]:
            index = max(bisect.bisect_right(self._since, at) - 1, 0)
        table = self._tables[index]
        found = table.get(model)
        if found is None:
            found = table.get(DEFAULT, ZERO)
        return found

    def reload(self, *, force: bool = False, strict: bool = False) -> bool:
        """Re-read the file if it changed; returns whether new prices took effect."""
        assert self.path is not None
        self._next_check = time.monotonic() + self.check_interval
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp and not force:
                return False
            with open(self.path, "rb") as f:
                doc: Mapping[str, object] = tomllib.load(f)
            if self.section is not None:
                doc = section_of(doc, self.section)
            prices = parse_prices(doc)
        except (OSError, tomllib.TOMLDecodeError, PricingError) as exc:
            if strict:
                raise
            log.error("pricing.reload_failed", path=str(self.path), error=str(exc))
            return False
        first = self._stamp is None
        self._stamp = stamp
        if first:  # the file's first prices apply to everything before them too
            self._tables[0] = prices
        elif prices == self._tables[-1]:
            return False
        else:
            # in force from when the operator saved the file, so a request that arrived after the
            # save pays the new price even if the check interval had not yet come round
            since = min(max(st.st_mtime, self._since[-1]), time.time())
            self._since.append(since)
            self._tables.append(prices)
            if len(self._since) > _MAX_VERSIONS:
                del self._since[0], self._tables[0]
                self._since[0] = 0.0
        log.info("pricing.loaded", path=str(self.path), models=len(prices))
        return True
