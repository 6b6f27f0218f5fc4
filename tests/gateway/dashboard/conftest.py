"""The dashboard in a real browser: the real gateway app served on loopback (tests/gateway/dashboard/served.py;
the `dashboard_server` fixture is in tests/conftest.py, the security tests use it too), teams, users and keys made
through the admin API, usage recorded through the gateway's own ledger, and Debian's Chromium driven by
Playwright. Screenshots go to tests/artifacts/dashboard/ (or $SLUICE_ARTIFACTS)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.gateway.dashboard.browser import chromium_page


@pytest.fixture
async def page():
    async with chromium_page() as page:
        yield page


@pytest.fixture(scope="session")
def artifacts() -> Path:
    folder = Path(os.environ.get("SLUICE_ARTIFACTS", "tests/artifacts")) / "dashboard"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
