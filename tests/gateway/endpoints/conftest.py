"""Named protocol workers for the static endpoints and the failover proxy (both databases the endpoints open:
`store_url`, tests/conftest.py)."""

from __future__ import annotations

import contextlib

import pytest

from testkit.protocol_worker import Reply, protocol_worker
from tests.gateway.endpoints.helpers import answer


@pytest.fixture
def named_workers():
    """Four protocol workers `stub-0`..`stub-3` (their `worker_id`), each answering `answer(its id)`."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(protocol_worker(worker_id=name, model=name, max_rows=8, max_context=64,
                                                   replies=[Reply(answer(name))]))
               for name in (f"stub-{i}" for i in range(4))]
