"""The app's own route table, for tests that must cover every route (a route added later included), and the
envelope each path answers errors in."""

from __future__ import annotations

import re

from litestar import Litestar

TGI_PATHS = {"/", "/generate", "/generate_stream", "/tokenize", "/v1/completions/generate",
             "/v1/completions/generate_stream", "/info"}
SGLANG_PATHS = {"/detokenize", "/get_model_info", "/get_server_info"}  # every other path answers in the OpenAI envelope
ANTHROPIC_PATHS = {"/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches", "/v1/messages/batches/x",
                   "/v1/messages/batches/x/cancel", "/v1/messages/batches/x/results"}


def route_table(app: Litestar) -> list[tuple[str, str, object]]:
    """(method, path with its parameters filled in, handler) for every route and method but OPTIONS."""
    found = []
    for route in app.routes:
        handlers = getattr(route, "route_handler_map", {})
        for method in sorted(set(route.methods) - {"OPTIONS", "HEAD"}):
            handler = handlers[method][0] if method in handlers else None
            found.append((method, re.sub(r"\{\w+(:\w+)?\}", "x", route.path), handler))
    return found


def envelope(path: str, body: dict) -> dict:
    """The error's fields in the envelope `path` answers in, as {"message", "kind"}: TGI's `error_type`, the
    OpenAI or Anthropic `type`, or None for SGLang's `{"error": {"message"}}`; fails on any other shape."""
    if path in TGI_PATHS:  # error_type only where TGI itself has one (not 401/403/404: those come before TGI)
        assert set(body) in ({"error", "error_type"}, {"error"}) and isinstance(body["error"], str), (path, body)
        return {"message": body["error"], "kind": body.get("error_type")}
    if path in ANTHROPIC_PATHS:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, (path, body)
        return {"message": body["error"]["message"], "kind": body["error"]["type"]}
    if path in SGLANG_PATHS:
        assert set(body) == {"error"} and set(body["error"]) == {"message"}, (path, body)
        return {"message": body["error"]["message"], "kind": None}
    assert set(body["error"]) >= {"message", "type", "param", "code"}, (path, body)
    return {"message": body["error"]["message"], "kind": body["error"]["type"]}
