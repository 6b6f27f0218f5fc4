"""LoRA adapters registered through the admin API, over the real app on both databases (a worker that plays the
protocol stands behind it): a restart keeps them, a deleted endpoint takes its own along, and the adapters an
endpoint's spec declares stay the spec's (a 409 to replace or remove through the API; the spec wins a name)."""

from __future__ import annotations

import msgspec

from gateway.config import Settings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.protocol_worker import MODEL
from tests.gateway.app_client import app_client

ADAPTERS = f"/admin/endpoints/{MODEL}/adapters"


def settings_on(gateway_settings: Settings, store_url: str, worker, declared: dict[str, str]) -> Settings:
    model = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]), adapters=declared)
    return msgspec.structs.replace(gateway_settings, database_url=store_url, models=[model])


async def listing(client, path: str = ADAPTERS) -> list[dict]:
    reply = await client.get(path, headers=client.admin_headers)
    assert reply.status_code == 200, reply.text
    return reply.json()["data"]


async def listed(client, path: str = ADAPTERS) -> dict[str, str]:
    return {adapter["name"]: adapter["source"] for adapter in await listing(client, path)}


async def test_registrations_survive_a_restart(store_url, gateway_settings, worker, tmp_path):
    verse = tmp_path / "verse"
    verse.mkdir()
    (verse / "adapter_config.json").write_text("{}")
    declared = {"poet": "s3://bucket/poet"}
    async with app_client(settings_on(gateway_settings, store_url, worker, declared)) as client:
        admin = client.admin_headers
        for name, source in (("verse", "s3://bucket/old-verse"), ("verse", str(verse)), ("gone", "s3://bucket/gone")):
            reply = await client.post(ADAPTERS, json={"name": name, "source": source}, headers=admin)
            assert reply.status_code == 201, reply.text
        assert (await client.delete(f"{ADAPTERS}/gone", headers=admin)).status_code == 200
        for reply in (await client.post(ADAPTERS, json={"name": "poet", "source": "s3://bucket/x"}, headers=admin),
                      await client.delete(f"{ADAPTERS}/poet", headers=admin)):
            assert reply.status_code == 409 and reply.json()["error"]["code"] == "adapter_declared", reply.text
        # an endpoint created through the API, given an adapter, then deleted: its adapter goes with it
        other = {"name": "org/other", "provisioner": {"kind": "static", "urls": [worker.url]}}
        assert (await client.post("/admin/endpoints", json=other, headers=admin)).status_code == 201
        reply = await client.post("/admin/endpoints/org/other/adapters", json={"name": "x", "source": "s3://b/x"},
                                  headers=admin)
        assert reply.status_code == 201, reply.text
        assert (await client.delete("/admin/endpoints/org/other", headers=admin)).status_code == 204

    async with app_client(settings_on(gateway_settings, store_url, worker, declared)) as client:
        assert await listed(client) == {"poet": "s3://bucket/poet", "verse": str(verse)}
        assert {a["name"]: a["origin"] for a in await listing(client)} == {"poet": "declared", "verse": "registered"}
        reply = await client.post("/v1/completions", json={"model": f"{MODEL}:verse", "prompt": "Hi", "max_tokens": 2},
                                  headers=client.key_headers)
        assert reply.status_code == 200, reply.text
        assert worker.requests[-1]["adapter"] == {"name": "verse", "source": str(verse)}
        models = (await client.get("/v1/models", headers=client.key_headers)).json()["data"]
        assert {m["id"] for m in models} >= {f"{MODEL}:poet", f"{MODEL}:verse"}
        assert (await client.post("/admin/endpoints", json=other, headers=client.admin_headers)).status_code == 201
        assert await listed(client, "/admin/endpoints/org/other/adapters") == {}

    # the config now declares `verse` itself: its source wins, and the stored registration is dropped for good
    async with app_client(settings_on(gateway_settings, store_url, worker, {"verse": "s3://bucket/spec"})) as client:
        assert await listed(client) == {"verse": "s3://bucket/spec"}
    async with app_client(settings_on(gateway_settings, store_url, worker, {})) as client:
        assert await listed(client) == {}


async def test_an_endpoint_body_declares_adapters_by_the_same_source_rule(gateway_app, worker, tmp_path):
    """The adapters in the body of POST /admin/endpoints are checked as the admin adapters API checks a source:
    a 422 naming the field; good ones are the endpoint's declared adapters."""
    (tmp_path / "adapter_config.json").write_text("{}")
    for source in ("relative/poet", "s3://", "s3:///prefix"):  # (a missing directory: only for local workers)
        body = {"name": "org/lora", "provisioner": {"kind": "static", "urls": [worker.url]},
                "adapters": {"poet": source}}
        reply = await gateway_app.post("/admin/endpoints", json=body, headers=gateway_app.admin_headers)
        error = reply.json()["error"]
        assert reply.status_code == 422 and "`adapters.poet`" in error["message"], reply.text
        assert error["code"] == "invalid_endpoint"
    body = {"name": "org/lora", "provisioner": {"kind": "static", "urls": [worker.url]},
            "adapters": {"poet": str(tmp_path), "verse": "s3://b/verse"}}
    assert (await gateway_app.post("/admin/endpoints", json=body, headers=gateway_app.admin_headers)).status_code == 201
    assert {a["name"]: a["origin"] for a in await listing(gateway_app, "/admin/endpoints/org/lora/adapters")} == {
        "poet": "declared", "verse": "declared"}
    reply = await gateway_app.post("/admin/endpoints/org/lora/adapters", json={"name": "extra", "source": "s3://b/x"},
                               headers=gateway_app.admin_headers)
    assert reply.status_code == 201 and reply.json()["origin"] == "registered", reply.text
