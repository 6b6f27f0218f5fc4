"""Shared fixtures of the real-SDK compatibility suites: one `sluice serve` per test module.

    def test_x(running_sluice):            # a testkit.sluice.SluiceServer
        httpx.post(f"{running_sluice.url}/v1/completions", headers=auth_headers, ...)
"""

from __future__ import annotations

import pytest

from testkit import sluice


@pytest.fixture(scope="module")
def running_sluice(tmp_path_factory):
    """The real gateway + worker with the default model, shared by the tests of one module."""
    with sluice.running_sluice(tmp_path_factory.mktemp("compat")) as server:
        yield server


@pytest.fixture(scope="module")
def auth_headers(running_sluice):
    return {"Authorization": f"Bearer {running_sluice.api_key}"}
