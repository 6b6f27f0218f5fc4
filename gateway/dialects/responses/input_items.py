"""`GET /v1/responses/{id}/input_items`: the input a stored response answered, as Responses items, one page at a
time (OpenAI's cursor list: `limit` 1-100, default 20; `order` desc by default; `after` / `before` an item id).

A stored response keeps its conversation as the worker's chat turns (store.py): its input is every turn but the
answer (a chained response's input includes the earlier turns it continued; `instructions` are not input items).
Item ids are derived from the response id and the item's place, so a cursor names the same item on every call."""

from __future__ import annotations

from gateway.serving.dialect import check

MAX_LIMIT = 100
DEFAULT_LIMIT = 20


def items_of(response_id: str, turns: list[dict]) -> list[dict]:
    """The chat turns as Responses input items (messages, function calls, function call outputs)."""
    suffix = response_id.removeprefix("resp_")
    items: list[dict] = []

    def next_id(prefix: str) -> str:
        return f"{prefix}_{suffix}_{len(items)}"

    for turn in turns:
        role, content = turn.get("role"), turn.get("content")
        if role == "tool":
            items.append({"type": "function_call_output", "id": next_id("fco"), "call_id": turn.get("tool_call_id"),
                          "output": content or "", "status": "completed"})
            continue
        if content or not turn.get("tool_calls"):
            kind = "output_text" if role == "assistant" else "input_text"
            items.append({"type": "message", "id": next_id("msg"), "role": role, "status": "completed",
                          "content": [{"type": kind, "text": content or ""}]})
        for call in turn.get("tool_calls") or []:
            function = call.get("function") or {}
            items.append({"type": "function_call", "id": next_id("fc"), "call_id": call.get("id"),
                          "name": function.get("name"), "arguments": function.get("arguments") or "",
                          "status": "completed"})
    return items


def page(items: list[dict], *, limit: int | None, order: str | None, after: str | None, before: str | None
         ) -> dict:
    """One page of `items` in OpenAI's list shape; a cursor that names no item is a 400 naming it."""
    limit = DEFAULT_LIMIT if limit is None else limit
    check(1 <= limit <= MAX_LIMIT, f"limit must be between 1 and {MAX_LIMIT}", "limit")
    order = order or "desc"
    check(order in ("asc", "desc"), "order must be asc or desc", "order")
    ordered = items if order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    start, stop = 0, len(ordered)
    if after is not None:
        check(after in ids, f"after: no input item {after[:128]!r} in this response", "after")
        start = ids.index(after) + 1
    if before is not None:
        check(before in ids, f"before: no input item {before[:128]!r} in this response", "before")
        stop = ids.index(before)
    window = ordered[start:stop]
    data = window[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(window) > limit}
