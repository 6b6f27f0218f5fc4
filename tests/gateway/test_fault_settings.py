"""The settings that bound what stalled clients and a full ledger disk may cost are checked at start-up."""

from __future__ import annotations

import pytest

from gateway.config import load_settings


@pytest.mark.parametrize(("name", "value"), [
    ("stream_write_timeout_s", "0"), ("stream_write_timeout_s", "-1"), ("stream_write_timeout_s", "3601"),
    ("stream_write_timeout_s", '"soon"'), ("ledger_min_free_bytes", "-1"), ("ledger_min_free_bytes", "1.5"),
    ("ledger_min_free_bytes", '"64M"'),
])
def test_bad_values_stop_the_start(tmp_path, name, value):
    config = tmp_path / "sluice.toml"
    config.write_text(f"{name} = {value}\n")
    with pytest.raises(SystemExit, match=name):
        load_settings(str(config))


def test_defaults():
    settings = load_settings(None)
    assert settings.stream_write_timeout_s == 30.0 and settings.ledger_min_free_bytes == 64 << 20
