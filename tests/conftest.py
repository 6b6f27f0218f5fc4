"""Session-wide fixtures: real database and cache servers, shared by every suite."""

from __future__ import annotations

import pytest

from tests.fixtures.servers import postgres_server, redis_server


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the whole session; tests create their own databases or schemas."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis():
    """A real redis-server for the whole session; tests use distinct key prefixes or FLUSHDB."""
    with redis_server() as server:
        yield server
