"""The public info routes (TGI's /info, SGLang's /get_model_info and /get_server_info) over the real app: anyone
may read them without a key, but a key that is sent holds: its allow-list refuses a model it may not call (403 in
the route's envelope), and no caller learns of another team's private endpoint."""

from __future__ import annotations

from testkit.protocol_worker import MODEL
from tests.gateway.app_client import new_key
from tests.gateway.route_table import envelope


async def test_info_routes_follow_the_callers_key(gateway_app, worker):
    another = await gateway_app.post("/admin/teams", json={"name": "another"}, headers=gateway_app.admin_headers)
    private = {"name": "org/private", "provisioner": {"kind": "static", "urls": [worker.url]},
               "team_id": another.json()["id"]}
    assert (await gateway_app.post("/admin/endpoints", json=private,
                                   headers=gateway_app.admin_headers)).status_code == 201
    allowed = await new_key(gateway_app, models=[MODEL])
    barred = await new_key(gateway_app, models=["some-other-model"])
    for headers in ({}, gateway_app.key_headers, allowed):
        assert (await gateway_app.get("/info", headers=headers)).json()["model_id"] == MODEL
        assert (await gateway_app.get("/get_model_info", headers=headers)).json()["model_path"] == MODEL
        served = (await gateway_app.get("/get_server_info", headers=headers)).json()["served_models"]
        assert [model["model_path"] for model in served] == [MODEL]
    for path in ("/info", "/get_model_info"):
        refused = await gateway_app.get(path, headers=barred)
        assert refused.status_code == 403 and MODEL in envelope(path, refused.json())["message"], refused.text
    assert (await gateway_app.get("/get_server_info", headers=barred)).json()["served_models"] == []
    served = (await gateway_app.get("/get_server_info", headers=gateway_app.admin_headers)).json()["served_models"]
    assert [model["model_path"] for model in served] == [MODEL, "org/private"]
