"""Builds usage records for tests."""

from __future__ import annotations

import time
import uuid

from billing.records import UsageRecord


def usage(**overrides) -> UsageRecord:
    fields = dict(request_id=f"req-{uuid.uuid4().hex}", time=time.time(), team_id="team-a", key_id="key-1",
                  user_id=None, model="small", dialect="openai", route="/v1/chat/completions",
                  prompt_tokens=10, completion_tokens=5, compute_tokens=5, status="ok", latency_ms=12.5,
                  ttft_ms=3.0, worker_id="w-1")
    fields.update(overrides)
    return UsageRecord(**fields)
