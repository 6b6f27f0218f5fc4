"""A batch's input, checked line by line before anything runs: OpenAI's JSONL file (`{"custom_id", "method",
"url", "body"}` per line) or Anthropic's `requests` list (`{"custom_id", "params"}`). A line that is not such an
object, a duplicate or over-long `custom_id`, a line for another URL than the batch's, or lines naming several
models fail the batch at validation (OpenAI's `errors`, Anthropic's 400), each error naming its line. A body the
dialect refuses is not checked here: it runs, and its refusal is that line's result (the error file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from common.json_body import MAX_DEPTH, nesting_depth_exceeds

MAX_CUSTOM_ID_CHARS = 64  # OpenAI's and Anthropic's bound
MAX_ERRORS = 100  # validation errors reported for one batch (the rest are counted)
OPENAI_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
ANTHROPIC_URL = "/v1/messages"
_decoder = msgspec.json.Decoder()
_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class Line:
    custom_id: str
    body: dict
    model: str


class Checked:
    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.errors: list[dict] = []
        self.error_count = 0
        self.seen: set[str] = set()

    def error(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})

    def add(self, number: int, custom_id: Any, body: Any) -> None:
        if not isinstance(custom_id, str) or not custom_id:
            self.error(number, "invalid_custom_id", "custom_id must be a non-empty string", "custom_id")
        elif len(custom_id) > MAX_CUSTOM_ID_CHARS:
            self.error(number, "invalid_custom_id", f"custom_id may be at most {MAX_CUSTOM_ID_CHARS} characters",
                       "custom_id")
        elif custom_id in self.seen:
            self.error(number, "duplicate_custom_id", f"The custom_id {custom_id!r} is used by more than one "
                       "request; each request of a batch needs its own.", "custom_id")
        elif not isinstance(body, dict):
            self.error(number, "invalid_body", "body must be a JSON object", "body")
        elif not isinstance(body.get("model"), str) or not body["model"]:
            self.error(number, "missing_required_parameter", "body.model is required", "body.model")
        else:
            self.seen.add(custom_id)
            self.lines.append(Line(custom_id, body, body["model"]))

    def one_model(self) -> None:
        models = {line.model for line in self.lines}
        if len(models) > 1:
            self.error(None, "mismatched_model", f"A batch's requests must all name one model; these name "
                       f"{len(models)}: {', '.join(sorted(m[:64] for m in models)[:4])}", "body.model")


def openai_file(raw: bytes, url: str, max_lines: int) -> Checked:
    """The lines of an uploaded JSONL file for a batch on `url`."""
    checked = Checked()
    rows = raw.split(b"\n")
    if rows and not rows[-1].strip():
        rows.pop()
    if len(rows) > max_lines:
        checked.error(None, "too_many_requests", f"A batch holds at most {max_lines} requests; this file has "
                      f"{len(rows)} lines.")
        return checked
    for number, row in enumerate(rows, start=1):
        if not row.strip():
            checked.error(number, "invalid_json_line", "The line is empty.")
            continue
        if nesting_depth_exceeds(row, MAX_DEPTH):
            checked.error(number, "invalid_json_line", f"The line nests deeper than {MAX_DEPTH} levels.")
            continue
        try:
            value = _decoder.decode(row)
        except msgspec.DecodeError:
            checked.error(number, "invalid_json_line", "This line is not parseable as valid JSON.")
            continue
        if not isinstance(value, dict):
            checked.error(number, "invalid_json_line", "Each line must be a JSON object.")
            continue
        if value.get("method") != "POST":
            checked.error(number, "invalid_method", "method must be POST", "method")
            continue
        if value.get("url") != url:
            checked.error(number, "invalid_url", f"The url of every line must be the batch's endpoint {url}",
                          "url")
            continue
        checked.add(number, value.get("custom_id"), value.get("body"))
    if not rows:
        checked.error(None, "empty_file", "The input file holds no requests.")
    checked.one_model()
    return checked


def anthropic_requests(requests: Any, max_lines: int) -> Checked:
    """The `requests` of an Anthropic batch create (models may differ: each line names its own)."""
    checked = Checked()
    if not isinstance(requests, list) or not requests:
        checked.error(None, "invalid_request", "requests must be a non-empty list", "requests")
        return checked
    if len(requests) > max_lines:
        checked.error(None, "invalid_request", f"A batch holds at most {max_lines} requests; this one has "
                      f"{len(requests)}.", "requests")
        return checked
    for number, request in enumerate(requests):
        if not isinstance(request, dict):
            checked.error(number, "invalid_request", "each request must be an object", f"requests.{number}")
            continue
        checked.add(number, request.get("custom_id"), request.get("params"))
    return checked


def encoded(body: dict) -> str:
    return _json.encode(body).decode()


def estimated_tokens(body: dict) -> int:
    """What a line may cost in tokens, for the enqueued-token limit: its JSON's characters / 4 (an upper estimate
    of a prompt's tokens) plus the output it asks for (a default of 1,024 where it names none)."""
    asked = next((body[k] for k in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                  if isinstance(body.get(k), int)), 1024)
    return len(encoded(body)) // 4 + max(0, asked)
