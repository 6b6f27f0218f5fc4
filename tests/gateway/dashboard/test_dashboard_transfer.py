"""What the dashboard sends over the wire: pages, CSS and scripts gzipped for a browser that accepts it (never a
CSV download, never an API stream), static files cached for a year under a URL that names their content, and the
CSRF token masked afresh in every page (a compressed page never holds the same bytes for it twice)."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.gateway.dashboard.test_dashboard_details import signed_in

pytestmark = pytest.mark.slow


async def test_pages_and_files_are_gzipped_and_files_cached(dashboard_server):
    team, _, owner = await dashboard_server.owned_team("Wire", "wanda", "wanda's")
    async with httpx.AsyncClient(base_url=dashboard_server.url, headers={"accept-encoding": "gzip"}) as client:
        await signed_in(client, owner["key"])
        page = await client.get("/dashboard/overview", params={"team_id": team})
        assert page.status_code == 200 and page.headers["content-encoding"] == "gzip", page.headers
        assert "accept-encoding" in page.headers["vary"].lower()
        assert int(page.headers["content-length"]) < len(page.text) / 3  # the page as sent, a third or less
        assert page.headers["cache-control"] == "no-store"  # a signed-in page is still never kept
        assets = re.findall(r'(?:href|src)="(/dashboard/static/[^"]+\?v=[0-9a-f]{12})"', page.text)
        assert len(assets) == 6, assets
        for asset in assets:
            answer = await client.get(asset)
            assert answer.status_code == 200, asset
            assert "max-age=31536000" in answer.headers["cache-control"], answer.headers
            assert "immutable" in answer.headers["cache-control"]
            if int(answer.headers["content-length"]) >= 1024 and not asset.endswith(".svg"):
                assert answer.headers.get("content-encoding") == "gzip", (asset, answer.headers)
        csv = await client.get("/dashboard/export.csv", params={"team_id": team})
        assert csv.status_code == 200 and "content-encoding" not in csv.headers  # a stream stays a stream
    async with httpx.AsyncClient(base_url=dashboard_server.url) as plain:  # no Accept-Encoding: none
        login = await plain.get("/dashboard/login", headers={"accept-encoding": "identity"})
        assert "content-encoding" not in login.headers


async def test_the_csrf_token_differs_in_every_page_and_each_works(dashboard_server):
    team, _, owner = await dashboard_server.owned_team("Masks", "mia", "mia's")
    async with httpx.AsyncClient(base_url=dashboard_server.url) as client:
        await signed_in(client, owner["key"])
        tokens = [re.search(r'name="csrf" value="([^"]+)"', (await client.get(
            "/dashboard/keys", params={"team_id": team})).text).group(1) for _ in range(3)]
        assert len(set(tokens)) == 3  # masked afresh each time
        for i, token in enumerate(tokens):
            made = await client.post("/dashboard/keys/create", params={"team_id": team},
                                     data={"csrf": token, "name": f"k{i}"})
            assert made.status_code == 201, made.text[:300]
        for forged in (tokens[0][:-2] + "00", tokens[0][:64], "zz" * 40, "", "0" * 5000):
            refused = await client.post("/dashboard/keys/create", params={"team_id": team},
                                        data={"csrf": forged, "name": "forged"})
            assert refused.status_code == 403, forged
