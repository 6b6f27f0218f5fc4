"""Friendli's legacy completions stream, the one friendli-client <= 1.5 parses.

    data: {"event":"token_sampled","index":0,"text":" such","token":1778}
    data: {"event":"complete","choices":[{"index":0,"seed":42,"text":"...","tokens":[...]}],"usage":{...}}

The client `json.loads` every non-empty line after stripping `data: `, so no `event:` or comment
lines, the `complete` event must carry no `token` key (it would be read as one more token), and
nothing may follow it: no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.dialects.base import incomplete, sse
from common.protocol import Accepted, Done, Event, Finish, Token


async def legacy_stream(events: AsyncIterator[tuple[int, Event]], n: int, logprobs: bool) -> AsyncIterator[bytes]:
    finished: dict[int, Finish] = {}
    dones: list[Done] = []
    async for prompt_index, event in events:
        base = prompt_index * n
        if isinstance(event, Token):
            line = {"event": "token_sampled", "index": base + event.index, "text": event.text,
                    "token": event.token_id}
            if logprobs:
                line["logprob"] = event.logprob
            if event.logits is not None:
                line["logits"] = event.logits
            yield sse(line)
        elif isinstance(event, Finish):
            finished[base + event.index] = event
        elif isinstance(event, Done):
            dones.append(event)
        elif isinstance(event, Accepted):
            continue
    choices = [{"index": index, "seed": f.seed, "text": f.text, "tokens": f.token_ids,
                "finish_reason": "length" if f.reason == "length" else "stop", **incomplete(f)}
               for index, f in sorted(finished.items())]
    prompt = sum(d.prompt_tokens for d in dones)
    completion = sum(d.completion_tokens for d in dones)
    yield sse({"event": "complete", "choices": choices,
               "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
