"""The public info routes (TGI's /info, SGLang's /get_model_info and /get_server_info) over the real app: anyone
may read them without a key, but a key that is sent holds: its allow-list refuses a model it may not call (403 in
the route's envelope), and no caller learns of another team's private endpoint."""

from __future__ import annotations

from tests.fixtures.protocol_worker import MODEL
from tests.gateway.conftest import new_key
from tests.gateway.route_table import envelope


async def test_info_routes_follow_the_callers_key(gateway, worker):
    another = await gateway.post("/admin/teams", json={"name": "another"}, headers=gateway.admin_headers)
    private = {"name": "org/private", "provisioner": {"kind": "static", "urls": [worker.url]},
               "team_id": another.json()["id"]}
    assert (await gateway.post("/admin/endpoints", json=private, headers=gateway.admin_headers)).status_code == 201
    allowed = await new_key(gateway, models=[MODEL])
    barred = await new_key(gateway, models=["some-other-model"])
    for headers in ({}, gateway.key_headers, allowed):
        assert (await gateway.get("/info", headers=headers)).json()["model_id"] == MODEL
        assert (await gateway.get("/get_model_info", headers=headers)).json()["model_path"] == MODEL
        served = (await gateway.get("/get_server_info", headers=headers)).json()["served_models"]
        assert [model["model_path"] for model in served] == [MODEL]
    for path in ("/info", "/get_model_info"):
        refused = await gateway.get(path, headers=barred)
        assert refused.status_code == 403 and MODEL in envelope(path, refused.json())["message"], refused.text
    assert (await gateway.get("/get_server_info", headers=barred)).json()["served_models"] == []
    served = (await gateway.get("/get_server_info", headers=gateway.admin_headers)).json()["served_models"]
    assert [model["model_path"] for model in served] == [MODEL, "org/private"]
