"""The ledger's finish reason (billing.records.FinishReason) as the gateway settles it, through the real gateway app
in front of the protocol worker: each reason a worker gives in the ledger's words, the rule for several choices (the
highest-ranked one: a cut choice is never hidden behind a complete one), a failed answer; and the field where a team
reads its records, `GET /v1/usage/requests` as JSON and CSV, for its own requests only. Cancelled and timed-out
requests: tests/gateway/test_request_scope.py; the real worker on SQLite and PostgreSQL:
tests/e2e/test_ledger_e2e.py."""

from __future__ import annotations

import csv
import io
from typing import get_args

import pytest

from billing.records import FINISH_REASONS
from common.protocol import Done, FinishReason
from gateway.serving.accounting import LEDGER_FINISH
from testkit.protocol_worker import Reply, tokens
from tests.gateway.app_client import new_key
from tests.gateway.generation_bodies import body
from tests.gateway.test_request_scope import record_of

PATH = "/v1/completions"


async def answered(gateway_app, payload: dict, headers: dict[str, str] | None = None):
    return await gateway_app.post(PATH, json=payload, headers=headers or gateway_app.key_headers)


def choices(*reasons: str) -> list:
    """One answer of len(reasons) choices, choice i ending with reasons[i]."""
    parts = [tokens(f"word{i} more", reason=reason, index=i) for i, reason in enumerate(reasons)]
    middles = [event for part in parts for event in part[1:-1]]
    return [parts[0][0], *middles, Done(prompt_tokens=3, completion_tokens=2 * len(reasons),
                                        compute_tokens=2 * len(reasons))]


def test_every_reason_a_worker_can_give_has_a_ledger_word():
    assert set(LEDGER_FINISH) == set(get_args(FinishReason)) and set(LEDGER_FINISH.values()) <= set(FINISH_REASONS)


@pytest.mark.parametrize(("worker_reason", "recorded"), [
    ("eos_token", "stop"), ("stop_sequence", "stop_sequence"), ("stop_token", "stop_sequence"), ("length", "length"),
    ("tool_calls", "tool_calls")])
async def test_each_worker_reason_in_the_ledgers_words(gateway_app, worker, worker_reason, recorded):
    worker.replies = [Reply(tokens(reason=worker_reason))]
    answer = await answered(gateway_app, body(PATH))
    assert answer.status_code == 200, answer.text
    record = await record_of(gateway_app, answer.headers["x-request-id"])
    assert (record["status"], record["finish_reason"]) == ("ok", recorded)


@pytest.mark.parametrize(("reasons", "recorded"), [
    (("eos_token", "length"), "length"), (("length", "eos_token"), "length"),
    (("stop_sequence", "tool_calls", "eos_token"), "tool_calls"), (("eos_token", "stop_token"), "stop_sequence")])
@pytest.mark.parametrize("stream", [False, True], ids=["collected", "stream"])
async def test_several_choices_record_the_highest_ranked_reason(gateway_app, worker, reasons, recorded, stream):
    worker.replies = [Reply(choices(*reasons))]
    answer = await answered(gateway_app, body(PATH, stream=stream, n=len(reasons)))
    assert answer.status_code == 200, answer.text
    record = await record_of(gateway_app, answer.headers["x-request-id"])
    assert (record["status"], record["finish_reason"]) == ("ok", recorded)


async def test_a_failed_answer_is_an_error_and_a_refused_one_has_none(gateway_app, worker):
    worker.replies = [Reply(tokens(reason="error"))]
    failed = await answered(gateway_app, body(PATH))
    assert failed.status_code == 502
    refused = await answered(gateway_app, body(PATH, max_tokens=-1))
    assert refused.status_code in (400, 422)
    records = [await record_of(gateway_app, r.headers["x-request-id"]) for r in (failed, refused)]
    assert [(r["status"], r["finish_reason"]) for r in records] == [("error", "error"), ("rejected", None)]


async def test_a_teams_request_listing_and_its_csv_carry_the_reason_of_its_own_requests(gateway_app, worker):
    colleague = await new_key(gateway_app)  # another key of the same team: its request is listed too
    worker.replies = [Reply(tokens(reason="length"))]
    mine = await answered(gateway_app, body(PATH))
    colleagues = await answered(gateway_app, body(PATH), headers=colleague)
    team = (await gateway_app.post("/admin/teams", json={"name": "elsewhere"},
                                   headers=gateway_app.admin_headers)).json()["id"]
    created = await gateway_app.post("/admin/keys", json={"name": "elsewhere", "team_id": team},
                                     headers=gateway_app.admin_headers)
    elsewhere = {"authorization": f"Bearer {created.json()['key']}"}
    worker.replies = [Reply(tokens(reason="eos_token"))]
    foreign = await answered(gateway_app, body(PATH), headers=elsewhere)
    ids = [r.headers["x-request-id"] for r in (mine, colleagues, foreign)]
    for request_id in ids:
        await record_of(gateway_app, request_id)  # shipped to the database
    window = {"start": "2000-01-01", "end": "2100-01-01"}
    listed = (await gateway_app.get("/v1/usage/requests", params=window,
                                    headers=gateway_app.key_headers)).json()["data"]
    assert {r["request_id"]: r["finish_reason"] for r in listed} == {ids[0]: "length", ids[1]: "length"}
    exported = await gateway_app.get("/v1/usage/requests", params={**window, "format": "csv"},
                                     headers=gateway_app.key_headers)
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert {r["request_id"]: r["finish_reason"] for r in rows} == {ids[0]: "length", ids[1]: "length"}
    elsewhere_listed = (await gateway_app.get("/v1/usage/requests", params=window, headers=elsewhere)).json()["data"]
    assert [(r["request_id"], r["finish_reason"]) for r in elsewhere_listed] == [(ids[2], "stop")]
