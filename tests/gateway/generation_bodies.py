"""One small valid body per generation route (each dialect once), for tests that run every dialect through the
in-process gateway (tests/gateway/app_client.py, the `gateway_app` fixture)."""

from __future__ import annotations

from testkit.protocol_worker import MODEL

HI = [{"role": "user", "content": "Hi"}]
BODIES = {  # path: body; STREAM_ONLY routes stream without a `stream` field
    "/v1/completions": {"model": MODEL, "prompt": "Hi"},
    "/v1/chat/completions": {"model": MODEL, "messages": HI},
    "/serverless/v1/completions": {"model": MODEL, "prompt": "Hi"},
    "/serverless/v1/chat/completions": {"model": MODEL, "messages": HI},
    "/generate": {"text": "Hi"},  # SGLang
    "/v1/generate": {"model": MODEL, "prompt": "Hi"},  # MonsterAPI
    "/generate_stream": {"inputs": "Hi"},  # TGI
    "/v1/completions/generate": {"inputs": "Hi"},  # DataCrunch
}
STREAM_ONLY = {"/generate_stream"}
NO_STREAM = {"/v1/completions/generate"}  # DataCrunch streams on its own path only


def body(path: str, stream: bool = False, **fields) -> dict:
    streamed = {"stream": True} if stream and path not in STREAM_ONLY | NO_STREAM else {}
    return {**BODIES[path], **streamed, **fields}
