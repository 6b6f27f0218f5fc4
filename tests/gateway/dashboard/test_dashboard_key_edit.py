"""The keys page's usage and grants, and the key edit form: each key's requests and spend in the range, its
last use, limits and model allow-list; owners rename keys and set a service key's limits (never above the
team's own) and models, through the same rule as `PATCH /v1/team/keys/{id}` (auth/policy.py). A member, a
personal key's grants, another team's key, a forged or malformed form: each is refused, at the field where it
is a field, and nothing changes."""

from __future__ import annotations

import html
import re
import time

import httpx
import pytest

from tests.billing.factory import usage
from tests.gateway.dashboard.served import ADMIN_KEY
from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow


@pytest.fixture
async def acme(dashboard_server) -> dict:
    """Acme (rpm at most 100) with owner olga, member mo, a service key that served two requests; and Other,
    another team with a service key."""
    team = (await dashboard_server.admin("POST", "/admin/teams", name="Acme", limits={"rpm": 100, "tpm": 50000}))["id"]
    olga = (await dashboard_server.admin("POST", "/admin/users", name="olga"))["id"]
    mo = (await dashboard_server.admin("POST", "/admin/users", name="mo"))["id"]
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{olga}", role="owner")
    await dashboard_server.admin("PUT", f"/admin/teams/{team}/members/{mo}", role="member")
    owner = await dashboard_server.admin("POST", "/admin/keys", name="olga laptop", team_id=team, user_id=olga,
                                limits={"rpm": 10}, models=["small"])
    member = await dashboard_server.admin("POST", "/admin/keys", name="mo laptop", team_id=team, user_id=mo)
    service = await dashboard_server.admin("POST", "/admin/keys", name="batch", team_id=team, limits={"rpm": 60},
                                  models=["small"])
    other = (await dashboard_server.admin("POST", "/admin/teams", name="Other"))["id"]
    foreign = await dashboard_server.admin("POST", "/admin/keys", name="theirs", team_id=other)
    for cost_tokens in (1000, 3000):
        await dashboard_server.ledger.record(usage(team_id=team, key_id=service["id"], time=time.time() - 60,
                                          prompt_tokens=cost_tokens, completion_tokens=0, compute_tokens=0))
    await dashboard_server.ledger.flush(10)
    return {"id": team, "owner": owner, "member": member, "service": service, "other": other, "foreign": foreign}


async def key_of(dashboard_server, key_id: str) -> dict:
    return next(k for k in (await dashboard_server.admin("GET", "/admin/keys"))["data"] if k["id"] == key_id)


def csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


async def post_edit(client: httpx.AsyncClient, team: str, key_id: str, **fields) -> httpx.Response:
    form = (await client.get("/dashboard/keys", params={"team_id": team})).text
    return await client.post(f"/dashboard/keys/{key_id}/edit", params={"team_id": team},
                             data={"csrf": csrf(form), **fields}, follow_redirects=False)


def field_error(page: str, field: str) -> str:
    found = re.search(rf'<p class="field-error" role="alert" id="{field}-error">([^<]+)</p>', page)
    assert found, page[-3000:]
    return html.unescape(found.group(1))


async def test_owner_sees_usage_and_grants_and_edits_a_service_key_in_chromium(dashboard_server, acme, page, artifacts):
    service = acme["service"]["id"]
    await page.goto(f"{dashboard_server.url}/dashboard/login")
    await page.fill("#api_key", acme["owner"]["key"])
    await page.click("button[type=submit]")
    await page.goto(f"{dashboard_server.url}/dashboard/keys?team_id={acme['id']}&range=24h")
    row = page.locator(f"tr[data-key-id='{service}']")
    assert (await row.locator("[data-requests]").inner_text()).strip() == "2"
    # 4,000 prompt tokens at $0.10 a million: $0.0004, shown as under a cent with the exact amount in the title
    assert await row.locator("[data-spend]").get_attribute("data-micros") == "400"
    assert (await row.locator("[data-limits]").inner_text()).strip() == "rpm 60"
    assert (await row.locator("[data-models]").inner_text()).strip() == "small"
    await page.screenshot(path=artifacts / "keys-usage-and-grants.png", full_page=True)

    await row.locator("[data-action=edit]").click()
    await page.wait_for_selector("#edit-key")
    assert "(team: at most 100)" in await page.inner_text("label[for=edit-rpm]")
    await page.fill("#edit-rpm", "500")  # above the team's own 100
    await page.click("#save-key")
    assert "at most the team's own limit, 100" in await page.inner_text("#rpm-error")
    assert await page.get_attribute("#edit-rpm", "aria-invalid") == "true"
    await page.screenshot(path=artifacts / "key-edit-refused.png", full_page=True)
    await page.fill("#edit-name", "nightly batch")
    await page.fill("#edit-rpm", "40")
    await page.fill("#edit-models", "small, big")
    await page.click("#save-key")
    await page.wait_for_url("**/dashboard/keys?**")
    row = page.locator(f"tr[data-key-id='{service}']")
    assert (await row.locator("[data-label=Name]").inner_text()).strip() == "nightly batch"
    assert (await row.locator("[data-limits]").inner_text()).strip() == "rpm 40"
    assert (await row.locator("[data-models]").inner_text()).strip() == "small, big"
    stored = await key_of(dashboard_server, service)
    assert (stored["name"], stored["limits"], stored["models"]) == ("nightly batch", {"rpm": 40}, ["small", "big"])
    audit = (await dashboard_server.admin("GET", "/admin/audit"))["data"]
    assert any(e["action"] == "keys.edit" and e["target"] == service for e in audit)


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"name": "  "}, "name", "Enter a name."),
    ({"name": "x" * 201}, "name", "at most 200"),
    ({"rpm": "1e3"}, "rpm", "digits 0-9"),
    ({"tpm": "٣"}, "tpm", "digits 0-9"),
    ({"max_concurrency": "-1"}, "max_concurrency", "digits 0-9"),
    ({"monthly_token_budget": "9" * 16}, "monthly_token_budget", "digits 0-9"),
    ({"tpm": "50001"}, "tpm", "at most the team's own limit, 50,000"),
    ({"models": " ".join(f"m{i}" for i in range(33))}, "models", "At most 32"),
    ({"models": "modèle"}, "models", "printable ASCII"),
    ({"models": "x" * 201}, "models", "at most 200"),
])
async def test_a_bad_field_is_said_at_the_field_and_changes_nothing(dashboard_server, acme, fields, field, says):
    service = acme["service"]["id"]
    before = await key_of(dashboard_server, service)
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, acme["owner"]["key"])
        answer = await post_edit(client, acme["id"], service, **{"name": "batch", "models": "small", "rpm": "60",
                                                                   **fields})
    assert answer.status_code in (400, 403) and says in field_error(answer.text, field)
    assert await key_of(dashboard_server, service) == before


async def test_who_may_edit_which_key(dashboard_server, acme):
    owner_key = acme["owner"]
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, owner_key["key"])
        # another team's key: the same 404 as a key that does not exist, read or written
        for key_id in (acme["foreign"]["id"], "nosuchkey"):
            assert (await client.get(f"/dashboard/keys/{key_id}/edit", params={"team_id": acme["id"]})).status_code \
                == 404
            assert (await post_edit(client, acme["id"], key_id, name="mine")).status_code == 404
        # a member's personal key: its own user's (block it instead)
        assert (await post_edit(client, acme["id"], acme["member"]["id"], name="mine")).status_code == 403
        # the owner's own personal key: renamed, but its grants stay the operator's (a forged field is refused)
        form = (await client.get(f"/dashboard/keys/{owner_key['id']}/edit", params={"team_id": acme["id"]})).text
        assert 'id="edit-rpm"' not in form and "grants-note" in form
        refused = await post_edit(client, acme["id"], owner_key["id"], name="olga's", rpm="99")
        assert refused.status_code == 403 and "set by the operator" in field_error(refused.text, "limits")
        renamed = await post_edit(client, acme["id"], owner_key["id"], name="olga's")
        assert renamed.status_code == 303
        # a form without this session's token
        forged = await client.post(f"/dashboard/keys/{acme['service']['id']}/edit", params={"team_id": acme["id"]},
                                   data={"csrf": "forged", "name": "x"})
        assert forged.status_code == 403
    stored = await key_of(dashboard_server, owner_key["id"])
    assert (stored["name"], stored["limits"], stored["models"]) == ("olga's", {"rpm": 10}, ["small"])
    assert (await key_of(dashboard_server, acme["foreign"]["id"]))["name"] == "theirs"
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, acme["member"]["key"])  # a member who is not an owner
        assert (await client.get(f"/dashboard/keys/{acme['service']['id']}/edit",
                                 params={"team_id": acme["id"]})).status_code == 403
        token = csrf((await client.get("/dashboard/overview", params={"team_id": acme["id"]})).text)
        posted = await client.post(f"/dashboard/keys/{acme['service']['id']}/edit", params={"team_id": acme["id"]},
                                   data={"csrf": token, "name": "mo's now"})
        assert posted.status_code == 403
    assert (await key_of(dashboard_server, acme["service"]["id"]))["name"] == "batch"


async def test_the_team_api_edits_keys_under_the_same_rule(dashboard_server, acme):
    service = acme["service"]["id"]

    async def patch(key: str, key_id: str, **body) -> httpx.Response:
        async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
            return await client.patch(f"/v1/team/keys/{key_id}", json=body, headers={
                "authorization": f"Bearer {key}", "x-team-id": acme["id"]})

    owner = acme["owner"]["key"]
    assert (await patch(owner, service, limits={"rpm": 101})).status_code == 403
    assert (await patch(owner, service, name="")).status_code == 400
    assert (await patch(owner, service, models=["m"] * 33)).status_code == 400
    assert (await patch(owner, service, nickname="x")).status_code == 400
    assert (await patch(owner, acme["foreign"]["id"], name="x")).status_code == 404
    assert (await patch(acme["member"]["key"], service, name="x")).status_code == 403
    done = await patch(owner, service, name="api batch", limits={"rpm": 100}, models=[])
    assert done.status_code == 200, done.text
    assert (done.json()["name"], done.json()["limits"], done.json()["models"]) == ("api batch", {"rpm": 100}, [])
    admin = await patch(ADMIN_KEY, service, limits={"rpm": 100000})  # the operator is not capped
    assert admin.status_code == 200 and admin.json()["limits"] == {"rpm": 100000}


async def test_a_bad_range_is_said_at_the_keys_pages_field(dashboard_server, acme):
    async with httpx.AsyncClient(base_url=dashboard_server.url, timeout=30) as client:
        await signed_in(client, acme["owner"]["key"])
        answer = await client.get("/dashboard/keys", params={"team_id": acme["id"], "range": "5y"})
    assert answer.status_code == 400 and "range must be one of" in field_error(answer.text, "keys-range")
    assert f'data-key-id="{acme["service"]["id"]}"' in answer.text
