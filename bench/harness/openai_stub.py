"""An OpenAI-shaped upstream that answers at once, for the gateway bench: what LiteLLM fronts, as
testkit/protocol_worker.py is what Sluice fronts. `POST /v1/chat/completions` answers `max_tokens` tokens
(one chat.completion, or that many SSE chunks and `[DONE]` when `stream` is true).

Run (from the repository root): python -m bench.harness.openai_stub --port P
"""

from __future__ import annotations

import argparse
import gc
import time

import msgspec
import uvicorn

from testkit.servers import read_body

JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class ChatBody(msgspec.Struct):
    model: str = "stub-model"
    max_tokens: int = 16
    stream: bool = False


def completion(model: str, tokens: int) -> bytes:
    return msgspec.json.encode({
        "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x " * tokens},
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}})


def chunk(model: str, content: str | None, finish: str | None, usage: dict | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
        return
    raw = await read_body(receive)
    body = msgspec.json.decode(raw, type=ChatBody)
    if not body.stream:
        await send({"type": "http.response.start", "status": 200, "headers": JSON})
        await send({"type": "http.response.body", "body": completion(body.model, body.max_tokens)})
        return
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    for _ in range(body.max_tokens):
        await send({"type": "http.response.body", "body": chunk(body.model, "x ", None), "more_body": True})
    usage = {"prompt_tokens": 8, "completion_tokens": body.max_tokens, "total_tokens": 8 + body.max_tokens}
    await send({"type": "http.response.body", "body": chunk(body.model, None, "length", usage), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    gc.collect()
    gc.freeze()  # as Sluice's stub worker and the gateway itself do: no collector pauses that are the stub's own
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", loop="uvloop", http="httptools",
                backlog=4096, access_log=False)


if __name__ == "__main__":
    main()
