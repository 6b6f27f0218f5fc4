"""Billing cannot be configured away: no setting turns the usage ledger off. Only bench/ledger_gateway.py's
baseline runs without one, through `create_app(ledger=False)` (SLUICE_BENCH_NO_LEDGER=1 for `sluice serve`)."""

from __future__ import annotations

import pytest

from gateway.config import Settings, load_settings
from gateway.edge.app import create_app


def test_no_setting_turns_the_ledger_off(tmp_path):
    config = tmp_path / "sluice.toml"
    config.write_text("ledger_enabled = false\n")
    with pytest.raises(SystemExit, match="unknown field `ledger_enabled`"):
        load_settings(str(config))


def test_the_usage_api_is_served_only_with_the_ledger():
    def usage_paths(**options) -> list[str]:
        return [path for path in create_app(Settings(), **options).route_handler_method_map if "usage" in path]

    assert {"/v1/usage", "/admin/usage"} <= set(usage_paths())
    assert usage_paths(ledger=False) == []
