"""Endpoint fixtures: both databases the gateway opens (a SQLite file, a fresh PostgreSQL database), as the
auth tests open them."""

from __future__ import annotations

from tests.auth.conftest import store_url  # noqa: F401 (a fixture)
