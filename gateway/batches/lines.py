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
    """What a batch's input came to: its errors (the first MAX_ERRORS) or, line by line, what the batch will
    hold. `keep=False` counts the lines without holding them (a file is checked as it is read)."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.lines: list[Line] = []
        self.errors: list[dict] = []
        self.error_count = 0
        self.seen: set[str] = set()
        self.models: set[str] = set()
        self.model = ""  # the first line's
        self.total = 0
        self.tokens = 0  # estimated_tokens of every line: what the batch holds of the enqueued-token limit

    def error(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})

    def add(self, number: int, custom_id: Any, body: Any) -> Line | None:
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
            line = Line(custom_id, body, body["model"])
            self.seen.add(custom_id)
            self.models.add(line.model[:64])
            self.model = self.model or line.model
            self.total += 1
            self.tokens += estimated_tokens(body)
            if self.keep:
                self.lines.append(line)
            return line
        return None

    def one_model(self) -> None:
        if len(self.models) > 1:
            self.error(None, "mismatched_model", f"A batch's requests must all name one model; these name "
                       f"{len(self.models)}: {', '.join(sorted(self.models)[:4])}", "body.model")


class OpenAIFile:
    """An uploaded JSONL file for a batch on `url`, checked piece by piece as it is read: `feed` gives the lines
    a piece completes and holds only the unfinished one (at most the upload's `max_line_bytes`), so a file of any
    size is checked in the memory of one piece. Once it has more than `max_lines` lines, they are only counted."""

    def __init__(self, url: str, max_lines: int) -> None:
        self.url, self.max_lines = url, max_lines
        self.checked = Checked(keep=False)
        self.rows = 0
        self._rest = b""

    def feed(self, data: bytes) -> list[Line]:
        rows = (self._rest + data).split(b"\n")
        self._rest = rows.pop()
        return self._check(rows)

    def finish(self) -> list[Line]:
        """The last line (a blank one after the final newline is no line), then the checks of the whole file."""
        lines = self._check([self._rest] if self._rest.strip() else [])
        self._rest = b""
        checked = self.checked
        checked.seen = set()  # every custom_id was compared: a large file's ids need not outlive its check
        if self.rows > self.max_lines:
            checked.errors, checked.error_count = [], 0
            checked.error(None, "too_many_requests", f"A batch holds at most {self.max_lines} requests; this file "
                          f"has {self.rows} lines.")
        elif not self.rows:
            checked.error(None, "empty_file", "The input file holds no requests.")
        checked.one_model()
        return lines

    def _check(self, rows: list[bytes]) -> list[Line]:
        lines: list[Line] = []
        for row in rows:
            self.rows += 1
            if self.rows > self.max_lines:
                continue
            line = self._line(self.rows, row)
            if line is not None:
                lines.append(line)
        return lines

    def _line(self, number: int, row: bytes) -> Line | None:
        checked = self.checked
        if not row.strip():
            checked.error(number, "invalid_json_line", "The line is empty.")
        elif nesting_depth_exceeds(row, MAX_DEPTH):
            checked.error(number, "invalid_json_line", f"The line nests deeper than {MAX_DEPTH} levels.")
        else:
            try:
                value = _decoder.decode(row)
            except msgspec.DecodeError:
                checked.error(number, "invalid_json_line", "This line is not parseable as valid JSON.")
                return None
            if not isinstance(value, dict):
                checked.error(number, "invalid_json_line", "Each line must be a JSON object.")
            elif value.get("method") != "POST":
                checked.error(number, "invalid_method", "method must be POST", "method")
            elif value.get("url") != self.url:
                checked.error(number, "invalid_url", f"The url of every line must be the batch's endpoint "
                              f"{self.url}", "url")
            else:
                return checked.add(number, value.get("custom_id"), value.get("body"))
        return None


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
