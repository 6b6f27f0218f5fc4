"""What prefix reuse and batching saved a team, in Chromium: the overview's tiles (cached prompt tokens, saved by the
prefix cache, batch spend, saved by batch) equal the usage API's sums of the team's own records, never another
team's; a batch line's detail shows its batch, its caller's custom_id as text, its prices and what it saved. The
prices are served.py's: small at $0.10 in, $0.025 cached in, $0.40 out a million, batch lines at half price."""

from __future__ import annotations

import time

import pytest

from billing.records import Price
from tests.billing.factory import usage
from tests.gateway.dashboard.served import ADMIN_KEY
from tests.gateway.dashboard.test_dashboard_browser import api_totals, sign_in, tiles, view_params

pytestmark = pytest.mark.slow
SMALL = Price(100_000, 400_000, 25_000, 50)
CUSTOM_ID = '<b>row</b> "7"'  # a caller's text: shown as it is, never as markup


async def test_the_overview_shows_what_cache_and_batches_saved_and_the_detail_a_batch_line(dashboard_server, page,
                                                                                           artifacts):
    team, user, key = await dashboard_server.owned_team("Savers", "sam", "sam's laptop")
    other, _, theirs = await dashboard_server.owned_team("Others", "oz", "oz's")
    now = time.time()
    mine = dict(team_id=team, key_id=key["id"], user_id=user, model="small", time=now - 3600)
    cached = usage(**mine, prompt_tokens=200_000, cached_tokens=150_000, completion_tokens=1000, compute_tokens=1000)
    batch = usage(**mine, prompt_tokens=400_000, completion_tokens=10_000, compute_tokens=10_000,
                  batch_id="batch_5f1e", custom_id=CUSTOM_ID)
    foreign = usage(team_id=other, key_id=theirs["id"], model="small", time=now - 3600, prompt_tokens=9_000_000,
                    cached_tokens=9_000_000, batch_id="batch_theirs", custom_id="x")
    for record in (cached, batch, foreign):
        await dashboard_server.ledger.record(record)
    await dashboard_server.ledger.flush(10)

    await sign_in(page, dashboard_server, key["key"])
    await page.wait_for_selector("[data-tile=batch_cost]")
    shown = await tiles(page)
    micros = {name: int(await page.get_attribute(f"[data-tile={name}]", "data-micros"))
              for name in ("cache_saved", "batch_cost", "batch_saved")}
    first, second = SMALL.charge(200_000, 1000, cached_tokens=150_000), SMALL.charge(400_000, 10_000, batch=True)
    assert micros == {"cache_saved": first.cache_saved_micros, "batch_cost": second.cost_micros,
                      "batch_saved": second.batch_saved_micros} == {"cache_saved": 11_250, "batch_cost": 22_000,
                                                                    "batch_saved": 22_000}
    assert shown["cached_tokens"] == "150,000"
    caveat = await page.inner_text(".tiles.savings .tile:first-child small")
    assert caveat.startswith("25 %") or caveat.startswith("25%")  # of 600,000 prompt tokens
    assert "1 batch line of 2 requests" in await page.inner_text(".tiles.savings")
    totals = await api_totals(dashboard_server, key["key"], view_params(page))  # the same view through the API
    assert (totals["cached_tokens"], totals["cache_saved_micros"], totals["batch_cost_micros"],
            totals["batch_saved_micros"]) == (150_000, *micros.values())
    row = "table[data-breakdown=model] tbody tr"  # the one model, its cached tokens, batch cost and both savings
    assert (await page.inner_text(f"{row} [data-cached]")).strip() == "150,000"
    assert await page.get_attribute(f"{row} [data-batch-micros]", "data-batch-micros") == "22000"
    assert await page.get_attribute(f"{row} [data-saved-micros]", "data-saved-micros") == str(11_250 + 22_000)
    await page.screenshot(path=artifacts / "overview-savings.png", full_page=True)
    await page.locator(".tiles.savings").screenshot(path=artifacts / "overview-savings-tiles.png")
    await page.locator("table[data-breakdown=model]").screenshot(path=artifacts / "overview-savings-by-model.png")

    await page.goto(f"{dashboard_server.url}/dashboard/requests/{batch.request_id}?team_id={team}")
    assert (await page.inner_text("[data-field=batch]")).strip() == f"batch_5f1e, line {CUSTOM_ID}"
    assert await page.query_selector("[data-field=batch] b") is None  # the caller's text, not markup
    assert (await page.inner_text("[data-field=cached_tokens]")).strip() == "0"
    assert "less 50 % for batch" in await page.inner_text("[data-field=prices]")
    assert await page.get_attribute("[data-field=saved]", "data-batch-micros") == "22000"
    await page.screenshot(path=artifacts / "request-detail-batch.png", full_page=True)
    # another team's batch line is no request of this team
    await page.goto(f"{dashboard_server.url}/dashboard/requests/{foreign.request_id}?team_id={team}")
    assert await page.query_selector("#request-detail") is None

    # the admin's ranking of teams: each team's batch spend and savings beside its cost
    await page.goto(f"{dashboard_server.url}/dashboard/overview?team_id={team}")
    await page.click("#sign-out")
    await sign_in(page, dashboard_server, ADMIN_KEY)
    await page.wait_for_url("**/dashboard/teams")
    ranked = await page.eval_on_selector_all("table[data-ranking] tbody tr", """rows => rows.map(r => [
        r.cells[1].innerText, r.querySelector('[data-batch-micros]').dataset.batchMicros,
        r.querySelector('[data-saved-micros]').dataset.savedMicros])""")
    foreign_saved = SMALL.charge(9_000_000, 5, cached_tokens=9_000_000, batch=True)
    assert ["Savers", "22000", str(11_250 + 22_000)] in ranked
    assert ["Others", str(foreign_saved.cost_micros),
            str(foreign_saved.cache_saved_micros + foreign_saved.batch_saved_micros)] in ranked
