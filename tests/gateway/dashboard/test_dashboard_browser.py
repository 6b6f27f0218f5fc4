"""Issue 14 in Chromium: sign in and out, a bad key, revocation, the team switcher and scope, the overview's
tiles against the usage API, filters that survive a reload, CSRF, the admin's ranking. Screenshots of every
page are saved (tests/artifacts/dashboard/)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from urllib.parse import parse_qs, urlparse
from zoneinfo import ZoneInfo

import httpx
import pytest

from billing.usage import micros_to_decimal
from tests.billing.factory import usage
from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.served import ADMIN_KEY

pytestmark = pytest.mark.slow
HOUR = 3600.0
COLD_WAITS_LAST_HOUR = (1200.0, 800.0, None)  # None: a replica was ready
COLD_WAIT_TWO_DAYS_AGO = 3000.0


async def seed(dashboard_server) -> dict:
    """Two teams; alice owns Acme and is a member of Beta; Beta has a service key; usage in both."""
    acme = (await dashboard_server.admin("POST", "/admin/teams", name="Acme"))["id"]
    beta = (await dashboard_server.admin("POST", "/admin/teams", name="Beta"))["id"]
    alice = (await dashboard_server.admin("POST", "/admin/users", name="alice"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{acme}/members/{alice}", role="owner")
    await dashboard_server.admin("PUT", f"/admin/teams/{beta}/members/{alice}", role="member")
    alice_key = await dashboard_server.admin("POST", "/admin/keys", name="alice laptop", team_id=acme, user_id=alice)
    beta_key = await dashboard_server.admin("POST", "/admin/keys", name="beta service", team_id=beta)
    now = time.time()
    records = [usage(team_id=acme, key_id=alice_key["id"], user_id=alice, model="small", time=now - HOUR,
                     prompt_tokens=1000 + i, completion_tokens=100, compute_tokens=100, cold_start_ms=cold)
               for i, cold in enumerate(COLD_WAITS_LAST_HOUR)]
    records += [usage(team_id=acme, key_id=alice_key["id"], user_id=alice, model="big", time=now - 2 * 24 * HOUR,
                      prompt_tokens=5000, completion_tokens=700, compute_tokens=700, latency_ms=250.0,
                      cold_start_ms=COLD_WAIT_TWO_DAYS_AGO),
                usage(team_id=acme, key_id=alice_key["id"], user_id=alice, model="small", time=now - 3 * HOUR,
                      status="error", error_code="upstream_failed", error_status=502, completion_tokens=0),
                usage(team_id=beta, key_id=beta_key["id"], model="small", time=now - HOUR, prompt_tokens=42,
                      completion_tokens=7, compute_tokens=7),
                usage(team_id="someone-else", key_id="k-x", model="small", time=now - HOUR, prompt_tokens=9_999)]
    for record in records:
        await dashboard_server.ledger.record(record)
    await dashboard_server.ledger.flush(10)
    return {"acme": acme, "beta": beta, "alice_key": alice_key, "beta_key": beta_key}


async def sign_in(page, dashboard_server, key: str) -> None:
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", key)
    await page.click("button[type=submit]")


async def tiles(page) -> dict[str, str]:
    found = {}
    for tile in await page.query_selector_all("[data-tile]"):
        found[await tile.get_attribute("data-tile")] = (await tile.inner_text()).strip()
    return found


async def api_totals(dashboard_server, key: str, params: dict, team: str | None = None) -> dict:
    headers = {"authorization": f"Bearer {key}", **({"x-team-id": team} if team else {})}
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        response = await client.get("/v1/usage", params={**params, "group_by": "none"}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["totals"]


def expected_tiles(totals: dict) -> dict[str, str]:
    return {"requests": f"{totals['requests']:,}", "prompt_tokens": f"{totals['prompt_tokens']:,}",
            "completion_tokens": f"{totals['completion_tokens']:,}",
            "cost": dollars(totals["cost_micros"])}


def dollars(micros: int) -> str:
    """Money as the dashboard shows it: to the cent, an amount under a cent to two significant digits (the exact
    amount is in the element's title)."""
    if 0 < micros < 10_000:
        return f"${Decimal(micros) / 10**6:.2g}"
    return f"${Decimal(micros_to_decimal(micros)).quantize(Decimal('0.01'), ROUND_HALF_UP):,}"


def view_params(page) -> dict:
    """The page URL's parameters, the window as the usage API reads it."""
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query).items()}


async def test_sign_in_overview_equals_the_usage_api_and_sign_out(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    await page.goto(f"{dashboard_server.url}/dashboard/overview")
    assert page.url.endswith("/dashboard/login?next=%2Fdashboard%2Foverview")  # and back there once signed in
    await page.screenshot(path=artifacts / "login.png", full_page=True)
    await sign_in(page, dashboard_server, data["alice_key"]["key"])
    assert "/dashboard/overview" in page.url
    await page.screenshot(path=artifacts / "overview-acme.png", full_page=True)
    shown = await tiles(page)
    # 90 days holds every record; the page's 7-day default holds the same ones
    totals = await api_totals(dashboard_server, data["alice_key"]["key"], {"start": "2000-01-01"})
    assert totals["requests"] == 5 and totals["prompt_tokens"] == 3003 + 5000 + 10
    assert {k: shown[k] for k in expected_tiles(totals)} == expected_tiles(totals)
    assert shown["error_rate"] == "20.00%"  # in the browser's locale (en-US)
    # the month's tiles and the budget panel: a token budget counts prompt + compute tokens since the UTC month
    # began, as the limiter
    await dashboard_server.admin("PATCH", f"/admin/teams/{data['acme']}", limits={"monthly_token_budget": 100_000})
    await page.reload()
    month_start = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    month = await api_totals(dashboard_server, data["alice_key"]["key"], {"start": month_start.isoformat()})
    used = month["prompt_tokens"] + month["compute_tokens"]
    assert (await tiles(page))["budget_tokens"] == f"{used:,}"
    budget = page.locator(f'table[data-budget-panel] tr[data-scope="team:{data["acme"]}"][data-kind=tokens]')
    assert await budget.locator("[data-label=Spent]").inner_text() == f"{used:,}"
    assert await budget.locator("[data-label=Limit]").inner_text() == "100,000"
    assert await budget.locator("[data-label=Used]").get_attribute("data-used") == f"{used / 1000:.0f}"
    assert (await tiles(page))["month_cost"] == dollars(month["cost_micros"])
    exact = await page.get_attribute("[data-tile=month_cost]", "data-micros")
    assert int(exact) == month["cost_micros"]
    by_model = await page.inner_text("table[data-breakdown=model] tbody")
    assert "big" in by_model and "small" in by_model
    assert await page.inner_text("table[data-breakdown=key] tbody th") == f"alice laptop {data['alice_key']['id']}"
    assert (await page.inner_text("table[data-breakdown=user] tbody th")).startswith("alice ")
    cookie = next(c for c in await page.context.cookies() if c["name"] == "sluice_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax" and cookie["path"] == "/dashboard"
    await page.click("#sign-out")
    assert page.url.endswith("/dashboard/login")
    await page.goto(f"{dashboard_server.url}/dashboard/overview")
    assert "/dashboard/login" in page.url


async def test_a_bad_key_is_a_message_on_the_page(dashboard_server, page, artifacts):
    await seed(dashboard_server)
    responses = []
    page.on("response", lambda r: responses.append(r.status) if r.request.method == "POST" else None)
    await sign_in(page, dashboard_server, "sk-sluice-000000000000-" + "a" * 32)
    assert (await page.inner_text("#login-message")) == "Invalid API key."
    assert responses == [401]
    await page.screenshot(path=artifacts / "login-bad-key.png", full_page=True)


async def test_the_team_switcher_changes_the_numbers_and_filters_survive_a_reload(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    key = data["alice_key"]["key"]
    await sign_in(page, dashboard_server, key)
    options = await page.eval_on_selector_all("#team-switch option", "els => els.map(e => e.textContent)")
    assert options == ["Acme (owner)", "Beta (member)"]
    await page.select_option("#team-switch", data["beta"])
    await page.wait_for_url(f"**team_id={data['beta']}**")
    beta = await api_totals(dashboard_server, key, {"start": "2000-01-01"}, team=data["beta"])
    assert beta["requests"] == 1
    shown = await tiles(page)
    assert {k: shown[k] for k in expected_tiles(beta)} == expected_tiles(beta)
    await page.screenshot(path=artifacts / "overview-beta.png", full_page=True)

    await page.select_option("#team-switch", data["acme"])
    await page.wait_for_url(f"**team_id={data['acme']}**")
    await page.select_option("#range", "30d")
    await page.select_option("#model", "big")  # the models this team used, to choose from
    await page.click("#apply")
    await page.wait_for_url("**model=big**")
    params = view_params(page)
    assert params["range"] == "30d" and params["model"] == "big" and params["team_id"] == data["acme"]
    big = await api_totals(dashboard_server, key, {"start": "2000-01-01", "model": "big"})
    assert big["requests"] == 1
    assert {k: (await tiles(page))[k] for k in expected_tiles(big)} == expected_tiles(big)
    await page.reload()
    assert await page.input_value("#model") == "big" and await page.input_value("#range") == "30d"
    assert {k: (await tiles(page))[k] for k in expected_tiles(big)} == expected_tiles(big)
    await page.screenshot(path=artifacts / "overview-filtered.png", full_page=True)


async def test_a_member_reaches_no_other_team_and_forms_need_the_csrf_token(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    await sign_in(page, dashboard_server, data["beta_key"]["key"])  # a service key: its own team only
    assert await page.eval_on_selector_all("#team-switch option", "els => els.length") == 1
    response = await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={data['acme']}")
    assert response.status == 404
    await page.screenshot(path=artifacts / "other-team-404.png", full_page=True)
    response = await page.goto(f"{dashboard_server.url}/dashboard/teams")
    assert response.status == 403
    # a form posted without this session's token (another site's form) changes nothing
    cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
    async with httpx.AsyncClient(base_url=dashboard_server.url, cookies=cookies) as client:
        forged = await client.post("/dashboard/logout", data={"csrf": "forged"})
        assert forged.status_code == 403
        assert (await client.get("/dashboard/overview")).status_code == 200  # still signed in
        assert (await client.post("/dashboard/login", data={"api_key": ADMIN_KEY})).status_code == 403


async def test_revoking_the_key_ends_its_sessions(dashboard_server, page):
    data = await seed(dashboard_server)
    await sign_in(page, dashboard_server, data["alice_key"]["key"])
    assert "/dashboard/overview" in page.url
    await dashboard_server.admin("DELETE", f"/admin/keys/{data['alice_key']['id']}")
    await page.reload()
    assert "/dashboard/login" in page.url


async def test_the_admin_sees_every_team_and_the_ranking(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    await sign_in(page, dashboard_server, ADMIN_KEY)
    await page.wait_for_url("**/dashboard/teams")  # not the empty default team: the ranking of every team
    options = await page.eval_on_selector_all("#team-switch option", "els => els.map(e => e.value)")
    assert {data["acme"], data["beta"]} <= set(options)
    await page.click("text=All teams")
    await page.wait_for_url("**/dashboard/teams**")
    rows = await page.eval_on_selector_all(
        "table[data-ranking] tbody tr", "rows => rows.map(r => [r.cells[1].innerText, Number(r.cells[2].innerText)])")
    assert rows == [["Acme", 5], ["someone-else", 1], ["Beta", 1]]  # by cost, then requests
    await page.screenshot(path=artifacts / "teams.png", full_page=True)

    # the admin's keys page: every team's keys with their team, narrowed by a team, any of them revoked
    await page.goto(f"{dashboard_server.url}/dashboard/keys")
    listed = await page.eval_on_selector_all("table[data-keys] tbody tr", "rows => rows.map(r => r.dataset.keyId)")
    assert {data["alice_key"]["id"], data["beta_key"]["id"]} <= set(listed)
    assert await page.inner_text(f"tr[data-key-id='{data['beta_key']['id']}'] [data-team]") == "Beta"
    await page.screenshot(path=artifacts / "keys-admin.png", full_page=True)
    await page.select_option("#keys-of", data["beta"])
    await page.wait_for_url(f"**keys_of={data['beta']}**")
    # narrowed to Beta: every key that can act in Beta, as its owners see them (alice's personal key, made in
    # Acme, included: a block of it in Beta is shown and undone here)
    listed = await page.eval_on_selector_all("table[data-keys] tbody tr", "rows => rows.map(r => r.dataset.keyId)")
    assert sorted(listed) == sorted([data["alice_key"]["id"], data["beta_key"]["id"]])
    assert await page.inner_text(f"tr[data-key-id='{data['beta_key']['id']}'] [data-team]") == "Beta"
    await page.fill("#key-name", "beta batch")
    await page.click("#create-key")
    created = (await page.inner_text("#new-key")).strip()
    assert await page.inner_text(f"tr[data-key-id='{created.split('-')[2]}'] [data-team]") == "Beta"
    await page.locator(f"tr[data-key-id='{data['beta_key']['id']}'] [data-action=revoke]").click()
    await page.click("#confirm-action")
    await page.wait_for_url("**/dashboard/keys**")
    assert await api_status(dashboard_server, data["beta_key"]["key"]) == 401
    assert await api_status(dashboard_server, created) == 200


async def test_requests_page_csv_and_chart_show_the_same_records_as_the_api(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    key = data["alice_key"]["key"]
    await sign_in(page, dashboard_server, key)
    # the chart is drawn (uPlot's canvas) from the same buckets as the table under it
    for name in ("tokens", "cost", "events"):
        await page.wait_for_selector(f"[data-chart={name}] canvas")
    chart = await page.eval_on_selector("[data-chart-data]", "e => JSON.parse(e.textContent)")
    table_tokens = await page.eval_on_selector_all(
        "table[data-series] tbody tr", "rows => rows.map(r => Number(r.cells[2].innerText.replaceAll(',', '')))")
    assert [sum(bucket) for bucket in zip(*(line["values"] for line in chart["tokens"]))] == table_tokens
    assert sum(table_tokens) == 3013 + 300 + 5700
    table_cost = await page.eval_on_selector_all("table[data-series] tbody tr",
                                                 "rows => rows.map(r => Number(r.cells[3].dataset.micros))")
    assert [round(sum(bucket) * 1e6) for bucket in zip(*(line["values"] for line in chart["cost"]))] == table_cost
    # cold-start waits per day (one day two days ago, one day an hour ago), drawn as the table holds them
    await page.wait_for_selector("[data-chart=waits] canvas")
    waits = await page.eval_on_selector_all("table[data-series] tbody tr", """rows => rows
        .filter(r => Number(r.cells[6].innerText) > 0)
        .map(r => [Number(r.cells[6].innerText), Number(r.cells[7].dataset.ms), Number(r.cells[8].dataset.ms)])""")
    assert waits == [[1, COLD_WAIT_TWO_DAYS_AGO, COLD_WAIT_TWO_DAYS_AGO], [2, 1000.0, 1200.0]]
    mean, longest = ([v for v in line["values"] if v is not None] for line in chart["waits"])
    assert mean == [COLD_WAIT_TWO_DAYS_AGO, 1000.0] and longest == [COLD_WAIT_TWO_DAYS_AGO, 1200.0]
    assert (await tiles(page))["cold_starts"] == "3 (1,667 ms / 3,000 ms)"
    # the keyboard walks the chart's buckets; the legend says what the table's row says
    labels = await page.eval_on_selector_all("table[data-series] tbody th", "cells => cells.map(c => c.innerText)")
    await page.focus("[data-chart=tokens]")
    legend = "[data-chart=tokens] .u-legend .u-series"
    for press, row in (("End", -1), ("ArrowLeft", -2), ("Home", 0), ("ArrowRight", 1)):
        await page.keyboard.press(press)
        shown = await page.eval_on_selector_all(legend, "rows => rows.map(r => r.querySelector('.u-value').innerText)")
        own = [int(value.removesuffix(" tokens").replace(",", "")) for value in shown[1:]]  # each model's own
        assert shown[0] == f"{labels[row]} 00:00" and sum(own) == table_tokens[row], (press, shown)

    await page.click("nav >> text=Requests")
    await page.wait_for_url("**/dashboard/requests**")
    await page.screenshot(path=artifacts / "requests.png", full_page=True)
    request_ids = "rows => rows.map(r => r.querySelector('[data-label=\"Request id\"]').innerText)"
    shown = await page.eval_on_selector_all("table[data-requests] tbody tr", request_ids)
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        api = await client.get("/v1/usage/requests", params={"start": "2000-01-01"},
                               headers={"authorization": f"Bearer {key}"})
    assert shown == [r["request_id"] for r in api.json()["data"]] and len(shown) == 5  # newest first, same order
    keys = await page.eval_on_selector_all("table[data-requests] tbody tr",
                                           "rows => rows.map(r => r.cells[1].innerText)")
    assert keys == ["alice laptop"] * 5  # names, as the breakdowns show them

    async with page.expect_download() as download_info:
        await page.click("#export-csv")
    download = await download_info.value
    path = artifacts / "view.csv"
    await download.save_as(path)
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    ids = [line.split(",")[header.index("request_id")] for line in lines[1:]]
    assert ids == shown


async def test_the_overview_is_usable_375_px_wide(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    await page.set_viewport_size({"width": 375, "height": 800})
    await sign_in(page, dashboard_server, data["alice_key"]["key"])
    await page.wait_for_selector("[data-chart=tokens] canvas")
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    await page.screenshot(path=artifacts / "overview-375px.png", full_page=True)
    await page.keyboard.press("Tab")  # the first stop is a link of the bar, outlined
    assert await page.evaluate("document.activeElement.tagName") == "A"


async def api_status(dashboard_server, key: str) -> int:
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        return (await client.get("/v1/usage", headers={"authorization": f"Bearer {key}"})).status_code


async def test_an_owner_creates_rotates_and_revokes_keys_from_the_page(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    await sign_in(page, dashboard_server, data["alice_key"]["key"])
    await page.click("nav >> text=Keys")
    await page.wait_for_url("**/dashboard/keys**")
    await page.fill("#key-name", "ci runner")
    await page.click("#create-key")
    created = (await page.inner_text("#new-key")).strip()
    assert created.startswith("sk-sluice-") and await api_status(dashboard_server, created) == 200
    await page.screenshot(path=artifacts / "keys-created.png", full_page=True)

    row = page.locator("tr", has_text="ci runner")
    await row.locator("input[name=grace_seconds]").fill("0")
    await row.locator("[data-action=rotate]").click()
    await page.click("#confirm-action")
    rotated = (await page.inner_text("#new-key")).strip()
    assert rotated != created and await api_status(dashboard_server, rotated) == 200
    assert await api_status(dashboard_server, created) == 401  # no grace: the old key is done

    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={data['acme']}")
    new_id = rotated.split("-")[2]
    await page.locator(f"tr[data-key-id='{new_id}'] [data-action=revoke]").click()
    await page.click("#confirm-action")
    await page.wait_for_url("**/dashboard/keys**")
    assert "revoked" in await page.inner_text(f"tr[data-key-id='{new_id}']")
    assert await api_status(dashboard_server, rotated) == 401
    await page.screenshot(path=artifacts / "keys.png", full_page=True)


async def test_a_member_cannot_manage_keys_nor_touch_another_teams(dashboard_server, page):
    data = await seed(dashboard_server)
    await sign_in(page, dashboard_server, data["alice_key"]["key"])
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={data['beta']}")
    assert await page.locator("nav >> text=Keys").count() == 0  # alice is a member of Beta
    csrf = await page.get_attribute("#sign-out-form input[name=csrf]", "value")
    assert (await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={data['beta']}")).status == 403
    beta_key = data["beta_key"]["id"]
    for team, status in ((data["beta"], 403), (data["acme"], 404)):  # a member; an owner of another team
        response = await page.request.post(f"{dashboard_server.url}/dashboard/keys/{beta_key}/revoke?team_id={team}",
                                           form={"csrf": csrf}, max_redirects=0)
        assert response.status == status
    assert await api_status(dashboard_server, data["beta_key"]["key"]) == 200


async def test_the_monthly_statement_downloads_as_the_api_writes_it(dashboard_server, page, artifacts):
    data = await seed(dashboard_server)
    key = data["alice_key"]["key"]
    await sign_in(page, dashboard_server, key)
    month = await page.input_value("#statement-month")
    async with page.expect_download() as download_info:
        await page.click("#statement-download")
    path = artifacts / "statement.csv"
    await (await download_info.value).save_as(path)
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        api = await client.get("/v1/usage/statement", params={"month": month, "format": "csv"},
                               headers={"authorization": f"Bearer {key}"})
    assert api.status_code == 200 and path.read_bytes() == api.content  # byte for byte (CRLF rows)
    response = await page.goto(f"{dashboard_server.url}/dashboard/statement.csv?team_id={data['acme']}&month=2025-13")
    assert response.status == 400 and "month" in await page.inner_text("#error-message")


LOCAL_ZONE = "Asia/Kolkata"  # +05:30: its days and hours both differ from UTC's


async def day_rows(page) -> list[list]:
    """The over-time table's days that saw requests: [day, requests, tokens]."""
    return await page.eval_on_selector_all("table[data-series] tbody tr", """rows => rows
        .map(r => [r.cells[0].innerText, Number(r.cells[1].innerText),
                   Number(r.cells[2].innerText.replaceAll(',', ''))])
        .filter(r => r[1] > 0)""")


async def api_days(dashboard_server, key: str, tz: str) -> list[list]:
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        response = await client.get("/v1/usage", params={"start": "2000-01-01", "group_by": "day", "tz": tz},
                                    headers={"authorization": f"Bearer {key}"})
    return [[r["key"], r["requests"], r["prompt_tokens"] + r["completion_tokens"]]
            for r in response.json()["rows"] if r["requests"]]


async def chart_time_label(page) -> str:
    """The chart legend's time of the point under the cursor (uPlot formats it in the chart's zone)."""
    box = await page.query_selector("[data-chart=tokens] .u-over")
    await box.scroll_into_view_if_needed()
    bounds = await box.bounding_box()
    await page.mouse.move(bounds["x"] + 1, bounds["y"] + 1)
    await page.mouse.move(bounds["x"] + bounds["width"] - 2, bounds["y"] + bounds["height"] / 2, steps=4)
    return await page.inner_text("[data-chart=tokens] .u-legend .u-series:first-child .u-value")


async def test_the_local_time_toggle_shows_the_browsers_zone(dashboard_server, artifacts):
    data = await seed(dashboard_server)
    key = data["alice_key"]["key"]
    async with chromium_page(timezone_id=LOCAL_ZONE) as page:
        await sign_in(page, dashboard_server, key)
        assert "(UTC)" in await page.inner_text("h1 small")  # UTC by default, whatever the browser's zone
        assert await day_rows(page) == await api_days(dashboard_server, key, "UTC")
        await page.wait_for_selector("[data-chart=tokens] canvas")
        assert (await chart_time_label(page)).endswith(" 00:00")  # a UTC day starts at the UTC midnight

        zone = await page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone")  # ICU's name: Asia/Calcutta
        assert ZoneInfo(zone).utcoffset(datetime.now()) == ZoneInfo(LOCAL_ZONE).utcoffset(datetime.now())
        await page.click("#local-time")
        await page.wait_for_url("**tz=**")
        await page.wait_for_selector("#utc-time")
        assert view_params(page)["tz"] == zone and f"({zone})" in await page.inner_text("h1 small")
        local = await api_days(dashboard_server, key, zone)
        assert await day_rows(page) == local and sum(r[1] for r in local) == 5
        await page.wait_for_selector("[data-chart=tokens] canvas")
        assert (await chart_time_label(page)).endswith(" 00:00")  # and now the Kolkata midnight
        now_local = datetime.now(ZoneInfo(LOCAL_ZONE))
        assert now_local.strftime("%Y-%m-%d %H:") in await page.inner_text("h1 small")  # the window's end, local
        await page.screenshot(path=artifacts / "overview-local-time.png", full_page=True)

        await page.reload()  # the zone is in the URL
        assert f"({zone})" in await page.inner_text("h1 small")
        await page.click("nav >> text=Requests")
        first = await page.inner_text("table[data-requests] tbody tr th")
        async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
            newest = (await client.get("/v1/usage/requests", params={"start": "2000-01-01"},
                                       headers={"authorization": f"Bearer {key}"})).json()["data"][0]
        assert first == datetime.fromtimestamp(newest["time"], ZoneInfo(LOCAL_ZONE)).strftime("%Y-%m-%d %H:%M:%S")
        await page.goto(f"{dashboard_server.url}/dashboard/overview?tz={LOCAL_ZONE}")
        await page.click("#utc-time")
        await page.wait_for_url("**tz=UTC**")
        assert "(UTC)" in await page.inner_text("h1 small")
