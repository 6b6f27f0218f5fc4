"""Endpoint names and owners (issue #31, item 12) through the real `sluice serve`: a name that would shadow a
route or a model alias (`.../adapters`, `tgi`), that holds `..`, `:` or an empty part, or that is too long is
refused, and so is a private endpoint whose `team_id` names no team; in the admin API (422 `invalid_endpoint`
in the envelope) and in the config file (one line, exit 1)."""

from __future__ import annotations

import httpx
import pytest

from gateway.endpoints.spec import NAME_LIMIT
from testkit.admin import admin_request
from testkit.protocol_worker import MODEL, protocol_worker
from testkit.sluice import create_team_offline, refused_start, running_sluice

ADMIN_KEY = "security-endpoint-names-admin-key-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
ENV = {"SLUICE_ADMIN_KEY": ADMIN_KEY}

# (name, words of the refusal)
REFUSED = [
    ("tgi", "first endpoint a caller may see"),  # the model TGI clients send: an endpoint so named took it over
    ("Default", "first endpoint a caller may see"),
    ("dummy", "first endpoint a caller may see"),
    ("org/adapters", "adapters"),  # GET /admin/endpoints/org/adapters lists org's adapters
    ("adapters/model", "adapters"),
    ("org/adapters/poet", "adapters"),
    ("org/../model", "'..'"),
    ("..", "'..'"),
    ("org/./model", "'.'"),
    (".hidden/model", "'.hidden'"),
    ("org/model:poet", "'model:poet'"),  # `<endpoint>:<adapter>` is how a body names an adapter
    ("org//model", "between two parts"),
    ("/model", "between two parts"),
    ("org/", "between two parts"),
    ("org/mödel", "'mödel'"),
    ("org/model?x=1", "'model?x=1'"),
    ("org/model%2Fx", "'model%2Fx'"),
    ("x" * (NAME_LIMIT + 1), f"1 to {NAME_LIMIT} characters"),
]

def static(*urls: str) -> dict:
    """A static provisioner over `urls`, as an endpoint body gives it."""
    return {"kind": "static", "urls": list(urls)}



@pytest.fixture(scope="module")
def worker():
    with protocol_worker() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def server(worker, tmp_path_factory):
    config = f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n'
    with running_sluice(tmp_path_factory.mktemp("names"), config=config, env=ENV) as running:
        yield running


def refusal(response: httpx.Response) -> dict:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_endpoint" and error["type"] == "invalid_request_error", error
    return error


@pytest.mark.parametrize(("name", "words"), REFUSED, ids=[name[:24] for name, _ in REFUSED])
def test_the_admin_api_refuses_a_name_that_shadows_a_route(server, worker, name, words):
    error = refusal(admin_request(server, "POST", "/admin/endpoints", name=name, provisioner=static(worker.url)))
    assert "`name`" in error["message"] and words in error["message"], error["message"]
    assert name not in {e["name"] for e in admin_request(server, "GET", "/admin/endpoints").json()["data"]}


def test_the_longest_name_and_a_hub_id_are_served(server, worker):
    for name in ("a" * NAME_LIMIT, "Org-1/Model_2.5-mini"):
        created = admin_request(server, "POST", "/admin/endpoints", name=name, provisioner=static(worker.url))
        assert created.status_code == 201, created.text
        assert admin_request(server, "GET", f"/admin/endpoints/{name}").json()["name"] == name
        assert admin_request(server, "DELETE", f"/admin/endpoints/{name}").status_code == 204


def test_no_endpoint_takes_over_the_alias_tgi_clients_send(server, worker):
    """A private endpoint named `tgi` answered every other team's `model: "tgi"` with a 404: refused now, and the
    alias keeps naming the first endpoint the caller may see."""
    team = admin_request(server, "POST", "/admin/teams", name="squatters").json()["id"]
    refusal(admin_request(server, "POST", "/admin/endpoints", name="tgi", provisioner=static(worker.url), team_id=team))
    key = admin_request(server, "POST", "/admin/keys", name="k", team_id=default_team(server)).json()["key"]
    answer = httpx.post(f"{server.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                        json={"model": "tgi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert answer.status_code == 200 and answer.json()["model"] in (MODEL, "tgi"), answer.text


def default_team(server) -> str:
    return next(t["id"] for t in admin_request(server, "GET", "/admin/teams").json()["data"] if t["name"] == "default")


def test_a_private_endpoint_needs_a_team_that_exists(server, worker):
    error = refusal(admin_request(server, "POST", "/admin/endpoints", name="org/private",
                                  provisioner=static(worker.url), team_id="team_does_not_exist"))
    assert error["param"] == "team_id" and "team_does_not_exist" in error["message"], error
    assert admin_request(server, "GET", "/admin/endpoints/org/private").status_code == 404
    team = admin_request(server, "POST", "/admin/teams", name="owners").json()["id"]
    created = admin_request(server, "POST", "/admin/endpoints", name="org/private", provisioner=static(worker.url),
                            team_id=team)
    assert created.status_code == 201 and created.json()["spec"]["team_id"] == team, created.text
    # a PATCH may hand the endpoint to another team, never to no team at all
    error = refusal(admin_request(server, "PATCH", "/admin/endpoints/org/private", team_id="team_gone"))
    assert error["param"] == "team_id"
    assert admin_request(server, "GET", "/admin/endpoints/org/private").json()["spec"]["team_id"] == team
    other = admin_request(server, "POST", "/admin/teams", name="heirs").json()["id"]
    moved = admin_request(server, "PATCH", "/admin/endpoints/org/private", team_id=other)
    assert moved.status_code == 200 and moved.json()["spec"]["team_id"] == other, moved.text
    assert admin_request(server, "DELETE", "/admin/endpoints/org/private").status_code == 204


def refused_at_start(tmp_path, config: str) -> str:
    """The one line `sluice serve` prints before it exits 1 on this config."""
    server = refused_start(tmp_path, config=config, env=ENV)
    lines = [line for line in server.lines if line.startswith("sluice:")]
    assert len(lines) == 1, server.output[-3000:]
    return lines[0]


@pytest.mark.parametrize(("name", "words"), [REFUSED[i] for i in (0, 3, 6, 10, 11, -1)],
                         ids=["tgi", "adapters", "dot-dot", "colon", "empty-part", "too-long"])
def test_a_config_file_with_such_a_name_does_not_start(tmp_path, worker, name, words):
    line = refused_at_start(tmp_path, f'[[models]]\nname = "{name}"\n'
                                      f'provisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
    assert "invalid configuration" in line and "`name`" in line and words in line, line


def test_a_config_file_must_name_a_team_that_exists(tmp_path, worker):
    entry = (f'[[models]]\nname = "{MODEL}"\nteam_id = "TEAM"\n'
             f'provisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
    line = refused_at_start(tmp_path, entry.replace("TEAM", "team_nobody_made"))
    assert "invalid configuration" in line and "team_id" in line and "team_nobody_made" in line, line
    # the same file once the team exists (made offline, as an operator would): the private endpoint serves
    team = create_team_offline(tmp_path, "acme")
    with running_sluice(tmp_path, config=entry.replace("TEAM", team), env=ENV) as server:
        assert admin_request(server, "GET", f"/admin/endpoints/{MODEL}").json()["spec"]["team_id"] == team
