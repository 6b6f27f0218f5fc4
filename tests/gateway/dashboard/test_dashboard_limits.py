"""The Limits page in Chromium: a member reaches it from the bar and reads the team's budget in money (spend,
thresholds reached, reset) and rate limits; its tables fit a desktop window and reflow on a phone. The
overview's budget panel shows the same figures as `GET /v1/team/limits`, for the team on screen only."""

from __future__ import annotations

import re
import time

import httpx

from billing.records import UsageRecord
from tests.gateway.dashboard.browser import chromium_page
from tests.gateway.dashboard.test_dashboard_tables import sign_in


async def beyond_the_box(page, table: str) -> float:
    """How far the table's body cells reach past its box or the viewport (on a phone the header row is
    visually hidden and the rows are cards)."""
    return await page.eval_on_selector(table, """t => {
        const cells = [...t.querySelectorAll('tbody td, tbody th')];
        const right = Math.max(...cells.map(c => c.getBoundingClientRect().right));
        return Math.max(t.scrollWidth - t.parentElement.clientWidth,
                        right - Math.min(document.documentElement.clientWidth,
                                         t.parentElement.getBoundingClientRect().right));
    }""")


DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 375, "height": 812}


async def test_a_member_reads_the_teams_limits_and_budget(dashboard_server, artifacts):
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Budgeted", limits={
        "rpm": 600, "tpm": 100000, "spend_budget": {"amount_micros": 1600, "period": "day"}}))["id"]
    user = (await dashboard_server.admin("POST", "/admin/users", name="mina"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{user}", role="member")
    key = await dashboard_server.admin("POST", "/admin/keys", name="mina's", team_id=team, user_id=user)
    # 4,000 prompt tokens of `small` at 100,000 micro-units a million, 1,000 output at 400,000: 400 + 400 micros
    await dashboard_server.ledger.record(UsageRecord(
        "limits-1", time.time() - 5, team, key["id"], user, "small", "openai", "/v1/completions", 4000, 1000,
        1000, "ok", 10.0, 2.0, "w"))
    await dashboard_server.ledger.flush(10)
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        async with chromium_page(viewport=viewport) as page:
            await sign_in(page, dashboard_server, key["key"])
            await page.click("nav >> text=Limits")
            await page.wait_for_url("**/dashboard/limits**")
            row = page.locator(f'tr[data-scope="team:{team}"]').first
            assert await row.locator("[data-label=Spent]").get_attribute("data-micros") == "800"
            assert await row.locator("[data-label='Alerts reached']").get_attribute("data-thresholds") == "50"
            assert "T00:00:00Z" in await row.locator("[data-label=Resets]").inner_text()
            rates = page.locator(f'table[data-limits=rates] tr[data-scope="team:{team}"]')
            assert "600" in await rates.locator("[data-label='Requests / min']").inner_text()
            await page.screenshot(path=artifacts / f"limits-{name}.png", full_page=True)
            for table in ("table[data-limits=budgets]", "table[data-limits=rates]"):
                assert await beyond_the_box(page, table) <= 0, (name, table)


async def panel(page) -> dict[tuple[str, str], dict[str, str]]:
    """The overview's budget panel: (scope, kind) -> its row's figures."""
    rows = await page.eval_on_selector_all("table[data-budget-panel] tbody tr[data-scope]", """rows => rows.map(r => [
        r.dataset.scope, r.dataset.kind, r.querySelector('[data-label=Spent]').dataset.spent,
        r.querySelector('[data-label=Limit]').dataset.limit, r.querySelector('[data-label=Used]').dataset.used,
        r.querySelector('[data-label="Alerts reached"]').dataset.thresholds,
        r.querySelector('[data-label="When spent"]').innerText,
        r.querySelector('[data-label=Resets]').dataset.resets])""")
    names = ("spent", "limit", "used", "thresholds", "when_spent", "resets")
    return {(scope, kind): dict(zip(names, values, strict=True)) for scope, kind, *values in rows}


def from_the_api(limits: dict) -> dict[tuple[str, str], dict[str, str]]:
    """`GET /v1/team/limits` as the panel's rows."""
    out = {}
    for b in limits["budgets"]:
        out[(b["scope"], "money")] = {
            "spent": str(b["spent_micros"]), "limit": str(b["amount_micros"]),
            "used": f"{b['spent_micros'] * 100 / b['amount_micros']:.0f}",
            "thresholds": ",".join(map(str, b["thresholds_reached"])),
            "when_spent": "requests refused" if b["hard"] else "alerts only", "resets": b["resets_at"]}
    for r in limits["rate_limits"]:
        if r.get("monthly_token_budget") is not None:
            out[(r["scope"], "tokens")] = {
                "spent": str(r["monthly_tokens_used"]), "limit": str(r["monthly_token_budget"]),
                "used": f"{r['monthly_tokens_used'] * 100 / r['monthly_token_budget']:.0f}", "thresholds": "",
                "when_spent": "requests refused", "resets": r["token_budget_resets_at"]}
    return out


async def test_the_overview_shows_the_teams_budgets_as_the_limits_api(dashboard_server, artifacts):
    """A member of two teams: each team's overview shows that team's budgets (money and tokens) and the member's
    key's own, with the figures of `GET /v1/team/limits` for that team, which equal the ledger's spend; the other
    team's budgets never appear. The panel fits a desktop window and a phone, light and dark."""
    teams = {}
    for name, amount, tokens in (("Panel A", 1600, 20_000), ("Panel B", 5_000_000, 400_000)):
        teams[name] = (await dashboard_server.admin("POST", "/admin/teams", name=name, limits={
            "monthly_token_budget": tokens,
            "spend_budget": {"amount_micros": amount, "period": "day", "hard": name == "Panel B"}}))["id"]
    user = (await dashboard_server.admin("POST", "/admin/users", name="omar"))["id"]
    for team in teams.values():
        await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{user}", role="member")
    key = await dashboard_server.admin("POST", "/admin/keys", name="omar's", team_id=teams["Panel A"], user_id=user,
                                       limits={"monthly_token_budget": 10_000,
                                               "spend_budget": {"amount_micros": 1500, "period": "month"}})
    # `small` costs 100,000 micro-units a million prompt tokens and 400,000 a million output tokens:
    # A: 400 + 400 micros, 5,000 budget tokens; B: 200 + 200 micros, 2,500 budget tokens; the key: both
    for team, prompt, output in ((teams["Panel A"], 4000, 1000), (teams["Panel B"], 2000, 500)):
        await dashboard_server.ledger.record(UsageRecord(
            f"panel-{team}", time.time() - 5, team, key["id"], user, "small", "openai", "/v1/completions", prompt,
            output, output, "ok", 10.0, 2.0, "w"))
    await dashboard_server.ledger.flush(10)
    ledger = {f"team:{teams['Panel A']}": (800, 5000), f"team:{teams['Panel B']}": (400, 2500),
              f"key:{key['id']}": (1200, 7500)}
    for name, team in teams.items():
        async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
            answer = await client.get("/v1/team/limits", headers={"authorization": f"Bearer {key['key']}",
                                                                   "x-team-id": team})
        assert answer.status_code == 200, answer.text
        expected = from_the_api(answer.json())
        assert set(expected) == {(scope, kind) for scope in (f"team:{team}", f"key:{key['id']}")
                                 for kind in ("money", "tokens")}
        for (scope, kind), row in expected.items():
            assert int(row["spent"]) == ledger[scope][0 if kind == "money" else 1], (scope, kind)
        assert expected[(f"team:{team}", "money")]["thresholds"] == ("50" if name == "Panel A" else "")
        assert expected[(f"key:{key['id']}", "money")]["thresholds"] == "50,80"  # 1,200 of 1,500 across both teams
        looks = (("desktop", DESKTOP, "light"), ("phone", PHONE, "light"), ("dark", DESKTOP, "dark"))
        for viewport_name, viewport, scheme in looks if name == "Panel A" else looks[:1]:
            async with chromium_page(viewport=viewport, color_scheme=scheme) as page:
                await sign_in(page, dashboard_server, key["key"])
                await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team}")
                assert await panel(page) == expected, (name, viewport_name)
                assert await beyond_the_box(page, "table[data-budget-panel]") <= 0, (name, viewport_name)
                assert await page.evaluate("document.documentElement.scrollWidth <= innerWidth")
                if name == "Panel A":
                    await page.locator("section:has(table[data-budget-panel])").screenshot(
                        path=artifacts / f"overview-budgets-{viewport_name}.png")


async def test_the_budget_panels_shares_have_thousands_separators(dashboard_server):
    """A token budget spent fifty times over reads "5,000 %" (and its projection likewise), as every other
    figure on the page; the data attributes keep the plain number."""
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Overspent",
                                         limits={"monthly_token_budget": 100}))["id"]
    key = await dashboard_server.admin("POST", "/admin/keys", name="over", team_id=team)
    await dashboard_server.ledger.record(UsageRecord(  # 4,000 + 1,000 budget tokens: 5,000 % of 100
        "overspent-1", time.time() - 5, team, key["id"], None, "small", "openai", "/v1/completions", 4000, 1000,
        1000, "ok", 10.0, 2.0, "w"))
    await dashboard_server.ledger.record(UsageRecord(  # two days of history: a projection is made
        "overspent-0", time.time() - 2 * 86400, team, key["id"], None, "small", "openai", "/v1/completions", 0, 0,
        0, "ok", 10.0, 2.0, "w"))
    await dashboard_server.ledger.flush(10)
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', (await client.get("/dashboard/login")).text).group(1)
        signed = await client.post("/dashboard/login", data={"csrf": csrf, "api_key": key["key"]})
        assert signed.status_code in (200, 303), signed.text
        page = await client.get(f"/dashboard/overview?team_id={team}")
    assert page.status_code == 200, page.text
    row = re.search(rf'<tr data-scope="team:{team}" data-kind="tokens">.*?</tr>', page.text).group(0)
    used = re.sub(r"<[^>]+>", "", re.search(r'<td data-label="Used".*?</td>', row).group(0))
    assert 'data-used="5000"' in row and "5,000 %" in used, row
    projected = int(re.search(r'data-projected="(\d+)"', row).group(1))
    assert projected >= 5000 and f"projected {projected:,} %" in used, row
