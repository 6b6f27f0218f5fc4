"""An HTTP driver for the tool-calling tests on the real SmolLM2 worker (tools and prompts: testkit.corpora.tools)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import jsonschema
import msgspec
import uvicorn

from common.protocol import (
    Accepted,
    Done,
    Error,
    Finish,
    FunctionTool,
    GenerateRequest,
    SamplingParams,
    Token,
    ToolCallDelta,
    ToolSpec,
    decode_event,
)
from testkit.corpora.tools import SCHEMAS, TOOLS
from testkit.servers import free_port, wait_for_port

_ids = itertools.count()



def chat(prompt: str | list[dict], choice: str = "required", *, function: str | None = None, parallel: bool = True,
         tools: list[FunctionTool] | None = None, tool_prompt: str | None = None, stream: bool = True,
         **params) -> GenerateRequest:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    spec = ToolSpec(functions=TOOLS if tools is None else tools, choice=choice, function=function,
                    parallel_calls=parallel, prompt=tool_prompt)
    params = {"temperature": 0.0, "max_tokens": 40, **params}
    return GenerateRequest(request_id=f"tools-{next(_ids)}", model="smol", messages=messages, tools=spec,
                           stream=stream, params=SamplingParams(**params))


@dataclass
class Reply:
    status: int
    body: str
    events: list = field(default_factory=list)

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def error(self) -> dict:
        return json.loads(self.body)

    @property
    def finish(self) -> Finish:
        assert not self.of(Error), self.of(Error)
        (finish,) = self.of(Finish)
        return finish

    @property
    def accepted(self) -> Accepted:
        return self.of(Accepted)[0]

    @property
    def done(self) -> Done:
        return self.of(Done)[0]

    def streamed_calls(self) -> list[dict]:
        """The tool calls as a streaming client rebuilds them from the deltas."""
        calls: dict[int, dict] = {}
        for delta in self.of(ToolCallDelta):
            if delta.id is not None:
                calls[delta.call] = {"id": delta.id, "name": delta.name, "arguments": ""}
            calls[delta.call]["arguments"] += delta.arguments
        return [calls[i] for i in sorted(calls)]

    def streamed_content(self) -> str:
        return "".join(t.text for t in self.of(Token))


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """The worker app behind a real uvicorn server on a free port (a thread of this process); its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="tools-test-uvicorn", daemon=True)
    thread.start()
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def _post(client, request: GenerateRequest) -> Reply:
    response = await client.post("/generate", content=msgspec.json.encode(request),
                                 headers={"content-type": "application/json"})
    reply = Reply(response.status_code, response.text)
    if response.status_code == 200:
        reply.events = [decode_event(line.encode()) for line in response.text.splitlines() if line]
    return reply


def post_all(url: str, requests: list[GenerateRequest]) -> list[Reply]:
    """Post every request at once (they share the engine's batch) and collect the replies in order."""
    async def run():
        limits = httpx.Limits(max_connections=len(requests))
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
            return await asyncio.gather(*(_post(client, r) for r in requests))
    return asyncio.run(run())


def post(url: str, request: GenerateRequest) -> Reply:
    return post_all(url, [request])[0]


def check_calls(finish: Finish, allowed: set[str]) -> None:
    """Every complete call names an allowed function and its arguments validate; only a cut output may hold
    an unfinished last call."""
    cut = finish.reason == "length"
    for number, call in enumerate(finish.tool_calls):
        assert call.name in allowed, (call.name, allowed)
        assert call.id.startswith("call_")
        if cut and number == len(finish.tool_calls) - 1:
            try:
                arguments = json.loads(call.arguments)
            except json.JSONDecodeError:
                assert finish.incomplete
                continue
        else:
            arguments = json.loads(call.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.name])
