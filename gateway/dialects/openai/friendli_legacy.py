"""Friendli's legacy completions stream, the one friendli-client <= 1.5 parses.

    data: {"event":"token_sampled","index":0,"text":" such","token":1778}
    data: {"event":"complete","choices":[{"index":0,"seed":42,"text":"...","tokens":[...]}],"usage":{...}}

The client `json.loads` every non-empty line after stripping `data: `, so no `event:` or comment
lines, the `complete` event must carry no `token` key (it would be read as one more token), and
nothing may follow it: no `[DONE]`. Those clients are recognised by `X-API-Dialect: friendli-legacy`
or by the keys only they send (`is_legacy`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from common.protocol import Accepted, Done, Event, Finish, Token
from gateway.serving.dialect import incomplete, sse

# keys only friendli-client <= 1.5 sends (even as null): their presence selects the legacy stream
LEGACY_KEYS = ("num_beams", "beam_search_type", "beam_compat_pre_normalization", "beam_compat_no_post_normalization",
               "include_output_logits", "include_output_logprobs", "timeout_microseconds")
LEGACY_HEADER = "friendli-legacy"  # the value of `X-API-Dialect` that forces the legacy stream


def wants_legacy(header: str | None) -> bool:
    return bool(header) and header.strip().lower() == LEGACY_HEADER


def is_legacy(payload, header: str | None) -> bool:
    """friendli-client <= 1.5 (legacy `token_sampled`/`complete` stream): header, or its legacy-only keys."""
    return wants_legacy(header) or (isinstance(payload, dict) and any(key in payload for key in LEGACY_KEYS))


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
               "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}})
