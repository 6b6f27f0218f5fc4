"""Clients' model aliases (`tgi`, `dummy`, `default`) have one owner, gateway/serving/model_aliases.py (issue #46,
item 3): through the real app each still names the first endpoint the caller may see and none may be taken as an
endpoint's name, in the admin API or the config file; the endpoints and replicas layers hold none of the words."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.endpoints.errors import EndpointNotFound, InvalidEndpoint
from gateway.endpoints.service import Endpoints
from gateway.endpoints.spec import parse_endpoint
from gateway.serving.model_aliases import MODEL_ALIASES, endpoint_named
from testkit.protocol_worker import MODEL
from tests.gateway.app_client import app_client

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
SPELLINGS = sorted(MODEL_ALIASES | {alias.upper() for alias in MODEL_ALIASES} | {"Default"})


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_each_alias_routes_to_the_default_and_no_endpoint_may_take_it(gateway_settings, worker):
    async with app_client(gateway_settings) as client:
        for alias in sorted(MODEL_ALIASES):
            answer = await client.post("/v1/chat/completions", json=chat(alias), headers=client.key_headers)
            assert answer.status_code == 200 and answer.json()["model"] in (MODEL, alias), (alias, answer.text)
        for name in SPELLINGS:
            refused = await client.post("/admin/endpoints", headers=client.admin_headers,
                                        json={"name": name, "provisioner": {"kind": "static", "urls": [worker.url]}})
            assert refused.status_code == 422, (name, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "invalid_endpoint" and "first endpoint a caller may see" in error["message"], error
        # an alias is no name: in another case it is a 404 like any unknown model
        unknown = await client.post("/v1/chat/completions", json=chat("TGI"), headers=client.key_headers)
        assert unknown.status_code == 404, unknown.text


async def test_the_endpoints_layer_refuses_the_names_it_is_given(tmp_path, worker):
    """`Endpoints` knows no alias of its own: the reserved names come from above, and a config entry with one
    does not start."""
    static = {"kind": "static", "urls": [worker.url]}
    declared = parse_endpoint({"name": "Dummy", "provisioner": static})
    endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/e.db", [declared], tmp_path,
                                     reserved_names=MODEL_ALIASES)
    try:
        with pytest.raises(InvalidEndpoint, match="`name` must not be 'Dummy'"):
            await endpoints.start()
    finally:
        await endpoints.drain_and_stop()
    served = parse_endpoint({"name": "org/m", "provisioner": static})
    endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/f.db", [served], tmp_path, reserved_names=MODEL_ALIASES)
    try:
        await endpoints.start()
        with pytest.raises(EndpointNotFound):
            endpoints.resolve("tgi", None)  # a name only, below the serving layer
        assert {endpoint_named(endpoints, alias, None).name for alias in MODEL_ALIASES} == {"org/m"}
        assert endpoint_named(endpoints, None, None).name == "org/m"
    finally:
        await endpoints.drain_and_stop()


@pytest.mark.parametrize("layer", ["endpoints", "replicas"])
def test_the_lower_layers_hold_none_of_the_words(layer):
    found = [f"{path.relative_to(GATEWAY)}:{node.lineno} {node.value!r}"
             for path in sorted((GATEWAY / layer).rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in MODEL_ALIASES]
    assert not found, f"a model alias in gateway/{layer} (its one owner is gateway/serving/model_aliases.py): {found}"
