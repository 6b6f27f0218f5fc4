"""End users and tags out of bounds (gateway/serving/request_tags.py): a 400 in the dialect's envelope naming the
field, through the real gateway app in front of the protocol worker. Recorded and found, sent by the real SDKs:
tests/gateway/dashboard/test_dashboard_end_users.py."""

from __future__ import annotations

import pytest

from testkit.protocol_worker import MODEL


@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/v1/chat/completions", {"user": "x" * 257}, "user"),
    ("/v1/chat/completions", {"user": "alice\nbob"}, "user"),
    ("/v1/chat/completions", {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k": 1}}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k" * 65: "v"}}, "metadata"),
    ("/v1/chat/completions", {"metadata": {"k": "v\u202e"}}, "metadata"),
    ("/v1/chat/completions", {"metadata": ["k", "v"]}, "metadata"),
    ("/v1/completions", {"user": 7}, "user"),
    ("/v1/responses", {"user": "x" * 257}, "user"),
    ("/v1/messages", {"metadata": {"user_id": "x" * 257}}, "metadata.user_id"),
    ("/v1/messages", {"metadata": {"user_id": "a\x00b"}}, "metadata.user_id"),
    ("/v1/messages", {"metadata": "carol"}, "metadata"),
])
async def test_an_out_of_bounds_end_user_or_tag_is_a_400_in_the_dialects_envelope(gateway_app, path, fields, param):
    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
              "/v1/completions": {"prompt": "hi"}, "/v1/responses": {"input": "hi"},
              "/v1/messages": {"messages": [{"role": "user", "content": "hi"}]}}
    limit = {"max_output_tokens": 16} if path == "/v1/responses" else {"max_tokens": 2}
    answer = await gateway_app.post(path, json={"model": MODEL, **limit, **bodies[path], **fields},
                                    headers=gateway_app.key_headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    if path == "/v1/messages":
        assert answer.json()["type"] == "error" and error["type"] == "invalid_request_error"
        assert param in error["message"]
    else:
        assert error["param"] == param, error
