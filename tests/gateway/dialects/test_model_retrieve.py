"""`GET /v1/models/{id}` (the openai SDK's `client.models.retrieve`) over the real app: the id's `/` raw or
percent-encoded, a LoRA adapter's `<endpoint>:<adapter>` id, and the tenant rules of the listing: a private
endpoint exists only for its own team, a key's allow-list hides what it may not call, and both are as unknown as
a model that does not exist (404 in OpenAI's envelope)."""

from __future__ import annotations

from testkit.protocol_worker import MODEL
from tests.gateway.app_client import new_key


async def team_key(gateway_app, name: str) -> tuple[str, dict]:
    created = await gateway_app.post("/admin/teams", json={"name": name}, headers=gateway_app.admin_headers)
    assert created.status_code == 201, created.text
    team_id = created.json()["id"]
    key = await gateway_app.post("/admin/keys", json={"name": name, "team_id": team_id},
                                 headers=gateway_app.admin_headers)
    assert key.status_code == 201, key.text
    return team_id, {"authorization": f"Bearer {key.json()['key']}"}


def assert_unknown(response, model_id: str) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["param"] == "model" and error["code"] == "model_not_found" and model_id in error["message"], error


async def test_a_model_is_retrieved_by_its_id(gateway_app):
    reply = await gateway_app.get(f"/v1/models/{MODEL}", headers=gateway_app.key_headers)
    assert reply.status_code == 200, reply.text
    listed = (await gateway_app.get("/v1/models", headers=gateway_app.key_headers)).json()["data"]
    assert reply.json() == next(entry for entry in listed if entry["id"] == MODEL)
    assert reply.json()["object"] == "model"
    assert_unknown(await gateway_app.get("/v1/models/no-such-model", headers=gateway_app.key_headers), "no-such-model")
    assert (await gateway_app.get(f"/v1/models/{MODEL}")).status_code == 401


async def test_a_private_endpoint_is_retrieved_by_its_team_only(gateway_app, worker):
    team_id, own = await team_key(gateway_app, "owners")
    private = {"name": "org/private", "provisioner": {"kind": "static", "urls": [worker.url]}, "team_id": team_id}
    assert (await gateway_app.post("/admin/endpoints", json=private,
                                   headers=gateway_app.admin_headers)).status_code == 201
    for path in ("/v1/models/org/private", "/v1/models/org%2Fprivate"):
        mine = await gateway_app.get(path, headers=own)
        assert mine.status_code == 200 and mine.json()["id"] == "org/private", (path, mine.text)
        assert_unknown(await gateway_app.get(path, headers=gateway_app.key_headers), "org/private")


async def test_a_keys_allow_list_hides_the_models_it_may_not_call(gateway_app):
    barred = await new_key(gateway_app, models=["some-other-model"])
    assert_unknown(await gateway_app.get(f"/v1/models/{MODEL}", headers=barred), MODEL)
