"""The usage record the gateway hands to the ledger, and the priced entry the ledger stores."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import msgspec

Status = Literal["ok", "cancelled", "error", "rejected"]
STATUSES: tuple[str, ...] = ("ok", "cancelled", "error", "rejected")
# Why a request's answer ended, in the ledger's own words (a fixed vocabulary, whatever the dialect called it):
# stop (the model ended it: EOS, or its grammar accepted), stop_sequence (a stop string or stop token the caller
# named), length (max_tokens or the context), tool_calls, cancelled (the client left), timeout (the gateway's
# request_timeout_s or the client's own deadline), error. None: it never reached an answer (rejected), or the
# record predates the field. Several choices (n > 1, best_of, several prompts): FINISH_REASONS' first that any
# returned choice ended with, so a cut choice is never hidden behind a complete one.
FinishReason = Literal["error", "timeout", "cancelled", "length", "tool_calls", "stop_sequence", "stop"]
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)  # in that rank

# Token counts are validated when the ledger checks a record, so a bad value fails the caller
# instead of poisoning the write-ahead log.
Tokens = Annotated[int, msgspec.Meta(ge=0)]
Millis = Annotated[float, msgspec.Meta(ge=0)]
HttpStatus = Annotated[int, msgspec.Meta(ge=100, le=599)]
# the error_code of a request a budget refused (gateway.errors.QuotaExceeded): 429 in some dialects, 402 in others,
# counted apart from rate limits by the dashboards
BUDGET_REFUSED = "insufficient_quota"


class UsageRecord(msgspec.Struct, array_like=True):
    """One request that reached the gateway's billing point; exactly one per request id.

    array_like: the write-ahead log stores fields by position (a third of the bytes to fsync), so
    new fields go last, with defaults."""

    request_id: str
    time: float  # unix seconds, UTC, when the request arrived (selects the price in force)
    team_id: str
    key_id: str
    user_id: str | None
    model: str
    dialect: str
    route: str
    prompt_tokens: Tokens
    completion_tokens: Tokens  # all returned choices
    compute_tokens: Tokens  # every generated token, incl. beams and best_of candidates not returned
    status: Status
    latency_ms: float
    ttft_ms: float | None
    worker_id: str
    # Added with the dashboards (schema 2). A record written to the log before them decodes with
    # these defaults, so they stay last and optional.
    cold_start_ms: Millis | None = None  # how long the request waited for its endpoint to wake
    error_code: str | None = None  # the error a failed or rejected request ended with
    error_status: HttpStatus | None = None  # that error's HTTP status (429: rate-limited)
    adapter: str = ""  # LoRA adapter name; "" for the base model
    # Added with the request detail view (schema 5), last for the same reason.
    finish_reason: FinishReason | None = None
    # Added with the search by a caller's own id (schema 6): the X-Request-Id the caller sent (None: none, or one
    # the gateway would not echo). Never the ledger key: two requests may send the same one.
    client_request_id: str | None = None
    # Added with cached-input and batch prices (schema 8), last for the same reason: the prompt tokens the worker's
    # prefix cache supplied (priced at the cached-input price), and the batch line the request ran for (None: an
    # interactive request; a record with a batch_id pays the batch rate). Both ids are cut to bounds.py's limits.
    cached_tokens: Tokens = 0
    batch_id: str | None = None
    custom_id: str | None = None
    # Added with Predicted Outputs (schema 9), last for the same reason: of `completion_tokens`, the tokens of the
    # request's `prediction` the answer took, and those the worker scored and refused (billed, as OpenAI bills them).
    # Both 0 without a prediction; the ledger keeps their sum within completion_tokens.
    accepted_prediction_tokens: Tokens = 0
    rejected_prediction_tokens: Tokens = 0
    # Added with end users and tags (schema 10), last for the same reason: the end user the caller named (OpenAI's
    # `user`, Anthropic's `metadata.user_id`) and its tags (OpenAI's `metadata`: string pairs), within
    # billing/bounds.py's limits. Never the caller's text: names the caller chose to tell its requests apart.
    end_user: str | None = None
    tags: dict[str, str] = {}

    @classmethod
    def rejected(cls, *, request_id: str, time: float, team_id: str, key_id: str, user_id: str | None,
                 model: str, dialect: str, route: str, latency_ms: float = 0.0, error_code: str | None = None,
                 error_status: int | None = None) -> UsageRecord:
        """A rate-limited or invalid request: counted as a request, zero tokens, never reached a worker."""
        return cls(request_id, time, team_id, key_id, user_id, model, dialect, route,
                   0, 0, 0, "rejected", latency_ms, None, "", error_code=error_code, error_status=error_status)


class LedgerEntry(msgspec.Struct, array_like=True):
    """A usage record plus the price in force when the request arrived and the resulting cost."""

    usage: UsageRecord
    input_price_micros: int  # per million prompt tokens
    output_price_micros: int  # per million generated (compute) tokens
    cost_micros: int
    recorded_at: float  # unix seconds, UTC, when the ledger accepted it
    # Added with schema 8, last and optional so that entries logged before them still decode (their records have
    # no cached tokens and no batch mark, so they saved nothing). None: the entry predates a cached-input price.
    cached_input_price_micros: int | None = None  # per million prompt tokens from the prefix cache
    batch_discount_percent: int = 0  # the discount in force for batch lines (applied when usage.batch_id is set)
    cache_saved_micros: int = 0  # what the cached tokens saved against the input price (list cost − cached cost)
    batch_saved_micros: int = 0  # what the batch rate saved on top (cached cost − cost)

    def flat(self) -> dict[str, Any]:
        """Named fields in a fixed order (the structs are array-like): what the records API, the CSV
        and the S3 export write for one request. Metadata only; the ledger never holds text."""
        return {**msgspec.structs.asdict(self.usage), "input_price_micros": self.input_price_micros,
                "output_price_micros": self.output_price_micros, "cost_micros": self.cost_micros,
                "recorded_at": self.recorded_at, "cached_input_price_micros": self.cached_input_price_micros,
                "batch_discount_percent": self.batch_discount_percent,
                "cache_saved_micros": self.cache_saved_micros, "batch_saved_micros": self.batch_saved_micros}


class Charge(msgspec.Struct, frozen=True):
    """A request's cost and what it saved against the list prices, in micro-units."""

    cost_micros: int  # what the team pays
    cache_saved_micros: int  # list cost (every prompt token at the input price) − the cost with cached prices
    batch_saved_micros: int  # the cost with cached prices − what the batch discount leaves of it


class Price(msgspec.Struct, frozen=True):
    """Micro-units per million tokens. `cached_input_micros` (None: the input price) prices the prompt tokens the
    prefix cache supplied; `batch_discount_percent` (0–100) comes off the whole cost of a batch line."""

    input_micros: int = 0
    output_micros: int = 0
    cached_input_micros: int | None = None
    batch_discount_percent: int = 0

    @property
    def cached_micros(self) -> int:
        return self.input_micros if self.cached_input_micros is None else self.cached_input_micros

    def cost(self, prompt_tokens: int, output_tokens: int) -> int:
        # Integer arithmetic end to end; round half up to the nearest micro-unit.
        return (prompt_tokens * self.input_micros + output_tokens * self.output_micros + 500_000) // 1_000_000

    def charge(self, prompt_tokens: int, output_tokens: int, *, cached_tokens: int = 0, batch: bool = False) -> Charge:
        """The cost with `cached_tokens` of the prompt at the cached-input price and, for a batch line, the batch
        discount off the whole; each amount rounded half up once, from exact integer sums, so that the list cost
        = cost + both savings, and neither saving is ever negative (the cached price is at most the input price)."""
        cached = min(cached_tokens, prompt_tokens)
        listed = self.cost(prompt_tokens, output_tokens)
        exact = ((prompt_tokens - cached) * self.input_micros + cached * self.cached_micros
                 + output_tokens * self.output_micros)  # micro-units × 10⁶
        with_cache = (exact + 500_000) // 1_000_000
        paid = 100 - self.batch_discount_percent if batch else 100
        cost = (exact * paid + 50_000_000) // 100_000_000
        return Charge(cost, listed - with_cache, with_cache - cost)
