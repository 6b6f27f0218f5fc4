"""The API objects of a batch: OpenAI's `batch` and Anthropic's `message_batch`, and each line's result as the
two APIs write it (OpenAI's output / error file lines, Anthropic's results lines)."""

from __future__ import annotations

import datetime
import hashlib

from gateway.batches.store import Batch, Counts

COMPLETION_WINDOW = "24h"


def _seconds(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _rfc3339(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.datetime.fromtimestamp(value, datetime.UTC).isoformat().replace("+00:00", "Z")


def openai_batch(batch: Batch, counts: Counts) -> dict:
    times = batch.times
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint, "errors": batch.errors,
        "input_file_id": batch.input_file_id, "completion_window": COMPLETION_WINDOW, "status": batch.status,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        **{name: _seconds(times[name]) for name in times},
        "request_counts": {"total": batch.total, "completed": counts.succeeded,
                           "failed": counts.errored + counts.expired + counts.cancelled},
        "usage": {"input_tokens": counts.prompt_tokens, "output_tokens": counts.completion_tokens,
                  "total_tokens": counts.prompt_tokens + counts.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        "metadata": batch.metadata,
    }


ANTHROPIC_STATUS = {"validating": "in_progress", "in_progress": "in_progress", "finalizing": "in_progress",
                    "cancelling": "canceling"}


def anthropic_batch(batch: Batch, counts: Counts, base_url: str) -> dict:
    times = batch.times
    status = ANTHROPIC_STATUS.get(batch.status, "ended")
    ended = None if status != "ended" else next(
        (times[name] for name in ("completed_at", "cancelled_at", "expired_at", "failed_at") if times[name]), None)
    return {
        "id": batch.id, "type": "message_batch", "processing_status": status,
        "request_counts": {"processing": counts.unfinished, "succeeded": counts.succeeded,
                           "errored": counts.errored, "canceled": counts.cancelled, "expired": counts.expired},
        "ended_at": _rfc3339(ended), "created_at": _rfc3339(times["created_at"]),
        "expires_at": _rfc3339(times["expires_at"]), "archived_at": None,
        "cancel_initiated_at": _rfc3339(times["cancelling_at"]),
        "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if status == "ended" else None,
    }


def line_request_id(batch_id: str, created_at: float, index: int) -> str:
    """The ledger's request id of a batch line: the same for every run of that line (the ledger records it once),
    time-ordered as the gateway's own ids are (gateway/serving/request_scope.py)."""
    digest = hashlib.sha256(f"{batch_id}:{index}".encode()).hexdigest()
    return f"{int(created_at * 1000):012x}{digest[:20]}"


OPENAI_LINE_ERRORS = {"expired": ("batch_expired", "This request could not be executed before the completion "
                                                   "window expired."),
                      "cancelled": ("batch_cancelled", "This request was not executed because the batch was "
                                                       "cancelled.")}


def openai_line(batch: Batch, index: int, custom_id: str, state: str, status_code: int | None,
                result: dict | None) -> dict:
    """An output (200) or error file line."""
    line_id = "batch_req_" + hashlib.sha256(f"{batch.id}:{index}".encode()).hexdigest()[:24]
    if state in OPENAI_LINE_ERRORS:
        code, message = OPENAI_LINE_ERRORS[state]
        return {"id": line_id, "custom_id": custom_id, "response": None, "error": {"code": code, "message": message}}
    request_id = line_request_id(batch.id, batch.times["created_at"] or 0.0, index)
    return {"id": line_id, "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": result}, "error": None}


def anthropic_line(custom_id: str, state: str, result: dict | None) -> dict:
    if state == "succeeded":
        return {"custom_id": custom_id, "result": {"type": "succeeded", "message": result}}
    if state == "errored":
        return {"custom_id": custom_id, "result": {"type": "errored", "error": result}}
    return {"custom_id": custom_id, "result": {"type": "canceled" if state == "cancelled" else "expired"}}
