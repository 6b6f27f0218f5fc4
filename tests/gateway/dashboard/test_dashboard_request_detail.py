"""A request's detail and the search by request id: everything the ledger holds about one request, found by
the id a customer quotes (the ledger's, or the response's `chatcmpl-...`), within the signed-in team only:
another team's id answers exactly as an unknown one. A malformed id is said at the search field."""

from __future__ import annotations

import html
import re
import time

import httpx
import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow
ID = "0193f1c2a4b5c6d7e8f90123456789ab"


@pytest.fixture
async def two_teams(dashboard_server) -> dict:
    """Team A's owner key; one A request that waited for a cold start on an adapter; one request of team B."""
    a = (await dashboard_server.admin("POST", "/admin/teams", name="Alpha"))["id"]
    b = (await dashboard_server.admin("POST", "/admin/teams", name="Beta"))["id"]
    ann = (await dashboard_server.admin("POST", "/admin/users", name="ann"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{a}/members/{ann}", role="owner")
    key = await dashboard_server.admin("POST", "/admin/keys", name="ann's laptop", team_id=a, user_id=ann)
    theirs = await dashboard_server.admin("POST", "/admin/keys", name="beta bot", team_id=b)
    await dashboard_server.ledger.record(usage(request_id=ID, team_id=a, key_id=key["id"], user_id=ann,
                                      time=time.time() - 90, prompt_tokens=1200, completion_tokens=34,
                                      compute_tokens=40, latency_ms=2345.0, ttft_ms=1900.0, cold_start_ms=1750.0,
                                      adapter="support-tone", status="error", error_code="worker_lost",
                                      error_status=502, dialect="openai", route="/v1/chat/completions",
                                      finish_reason="error"))
    other = usage(team_id=b, key_id=theirs["id"], time=time.time() - 60)
    await dashboard_server.ledger.record(other)
    await dashboard_server.ledger.flush(10)
    return {"a": a, "b": b, "key": key, "other_id": other.request_id}


def error_at_field(page: str) -> str:
    return html.unescape(re.search(r'<p class="field-error" role="alert" id="id-error">([^<]+)</p>', page).group(1))


async def test_search_by_the_responses_id_opens_the_requests_detail_in_chromium(dashboard_server, two_teams, page,
                                                                                  artifacts):
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", two_teams["key"]["key"])
    await page.click("button[type=submit]")
    await page.click("nav >> text=Find request")
    await page.fill("#request-id", f"  chatcmpl-{ID} ")  # as the customer pasted it
    await page.click("#find")
    await page.wait_for_selector("#request-detail")
    assert page.url.split("?")[0].endswith(f"/dashboard/requests/{ID}")

    async def shown(field: str) -> str:
        return (await page.inner_text(f"[data-field={field}]")).strip()

    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", await shown("time"))
    assert await shown("status") == "error (502 worker_lost)"
    assert await shown("finish_reason") == "error (it failed)"
    assert await shown("adapter") == "support-tone" and await shown("dialect") == "openai"
    assert await shown("route") == "/v1/chat/completions"
    assert (await shown("prompt_tokens"), await shown("completion_tokens"), await shown("compute_tokens")) == \
        ("1,200", "34", "40")
    assert await shown("cold_start") == "1,750 ms" and await shown("latency") == "2,345 ms"
    assert await shown("ttft") == "1,900 ms"
    # 1,200 at $0.10 and 40 at $0.40 a million
    assert await page.get_attribute("[data-field=cost]", "data-micros") == "136"
    assert await shown("cost") == "$0.00014"  # a request's cost to two significant digits, not "<$0.01"
    assert "ann's laptop" in await shown("key") and "ann" in await shown("user")
    await page.screenshot(path=artifacts / "request-detail.png", full_page=True)

    await page.fill("#request-id", "no-such-request")
    await page.click("#find")
    assert await page.inner_text("#id-error") == "No request with this id in this team."
    await page.screenshot(path=artifacts / "request-not-found.png", full_page=True)


async def test_the_detail_says_why_the_answer_ended_in_chromium(dashboard_server, two_teams, page, artifacts):
    """The finish reason the ledger holds (here `length`), in its word and a reader's; a record without one (refused
    before any answer, or recorded before finish reasons) says so."""
    cut = usage(team_id=two_teams["a"], key_id=two_teams["key"]["id"], time=time.time() - 30, completion_tokens=256,
                compute_tokens=256, finish_reason="length")
    refused = usage(team_id=two_teams["a"], key_id=two_teams["key"]["id"], time=time.time() - 20, status="rejected",
                    prompt_tokens=0, completion_tokens=0, compute_tokens=0, error_code="rate_limit_exceeded",
                    error_status=429)
    for record in (cut, refused):
        await dashboard_server.ledger.record(record)
    await dashboard_server.ledger.flush(10)
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", two_teams["key"]["key"])
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/requests/{cut.request_id}?team_id={two_teams['a']}")
    shown = (await page.inner_text("[data-field=finish_reason]")).strip()
    assert shown == "length (max_tokens or the model's context was reached)"
    await page.screenshot(path=artifacts / "request-detail-length.png", full_page=True)
    await page.goto(f"{dashboard_server.url}/dashboard/requests/{refused.request_id}?team_id={two_teams['a']}")
    assert (await page.inner_text("[data-field=finish_reason]")).strip().startswith("none (no answer was generated")


async def test_another_teams_request_answers_as_an_unknown_one(dashboard_server, two_teams):
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, two_teams["key"]["key"])
        answers = {}
        for name, rid in (("theirs", two_teams["other_id"]), ("unknown", "req-0000000000000000")):
            found = await client.get("/dashboard/request", params={"team_id": two_teams["a"], "id": rid})
            detail = await client.get(f"/dashboard/requests/{rid}", params={"team_id": two_teams["a"]})
            assert found.status_code == detail.status_code == 404
            answers[name] = (error_at_field(found.text), error_at_field(detail.text))
            assert "beta" not in found.text.lower() and "beta" not in detail.text.lower()
        assert answers["theirs"] == answers["unknown"]
        # the other team is not reachable by naming it either
        assert (await client.get(f"/dashboard/requests/{two_teams['other_id']}",
                                 params={"team_id": two_teams["b"]})).status_code == 404
        own = await client.get(f"/dashboard/requests/{ID}", params={"team_id": two_teams["a"]})
        assert own.status_code == 200 and 'id="request-detail"' in own.text


@pytest.mark.parametrize(("typed", "says"), [
    ("", "Enter a request id."),
    ("   ", "Enter a request id."),
    ("x" * 129, "at most 128"),
    ("abc def", "at most 128"),
    ("req'--", "at most 128"),
    ("ré", "at most 128"),
])
async def test_a_malformed_request_id_is_said_at_the_field(dashboard_server, two_teams, typed, says):
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, two_teams["key"]["key"])
        answer = await client.get("/dashboard/request", params={"team_id": two_teams["a"], "id": typed})
    assert answer.status_code == 400 and says in error_at_field(answer.text)


async def test_a_callers_own_x_request_id_finds_its_request(dashboard_server, two_teams, page):
    """A caller that sends its own X-Request-Id gets it back as the response's and quotes it to support: the
    ledger keeps it beside ours, and the search finds the team's newest request that sent it (never another
    team's)."""
    sent = "trace/2026-12-06T07:00Z=a+b"
    for team, key, when in ((two_teams["a"], two_teams["key"]["id"], 300), (two_teams["a"], two_teams["key"]["id"], 30),
                            (two_teams["b"], "beta-key", 10)):
        await dashboard_server.ledger.record(usage(team_id=team, key_id=key, time=time.time() - when,
                                                   client_request_id=sent, prompt_tokens=when))
    await dashboard_server.ledger.flush(10)
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", two_teams["key"]["key"])
    await page.click("button[type=submit]")
    await page.click("nav >> text=Find request")
    await page.fill("#request-id", sent)
    await page.click("#find")
    await page.wait_for_selector("#request-detail")
    assert (await page.inner_text("[data-field=client_request_id]")).strip() == sent
    assert (await page.inner_text("[data-field=prompt_tokens]")).strip() == "30"  # the newest of Alpha's two
