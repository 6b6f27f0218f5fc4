"""Settings: embedded defaults, overridden by a TOML file, then by SLUICE_* environment variables."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import msgspec

from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import EndpointSpec, as_endpoint


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str = ".data"
    database_url: str = ""  # "" = SQLite in the data dir; or postgresql://...
    redis_url: str = ""  # "" = in-process limiter; redis://... shares limits across gateways
    limiter_fail_open: bool = False
    pricing_file: str = ""  # TOML pricing table, re-read on change
    ledger_enabled: bool = True  # False: no usage records, no usage API (benchmarks only)
    max_body_bytes: int = 4 * 1024 * 1024
    log_format: str = "json"  # "json" or "console"
    models: list[EndpointSpec] = msgspec.field(default_factory=lambda: [EndpointSpec()])  # each one an endpoint
    scaling: ScalingSettings = msgspec.field(default_factory=ScalingSettings)

    def __post_init__(self) -> None:
        self.models = [as_endpoint(model) for model in self.models]

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_path / 'sluice.db'}"


ENV_FIELDS = {"host": str, "port": int, "data_dir": str, "database_url": str, "redis_url": str,
              "pricing_file": str, "log_format": str}


def load_settings(config_file: str | None = None, **overrides) -> Settings:
    """Defaults < config file < SLUICE_<FIELD> environment < explicit overrides (CLI flags).

    Every mistake exits with one line naming it (SystemExit)."""
    raw: dict = {}
    if config_file:
        try:
            raw = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SystemExit(f"sluice: cannot read the config file {config_file}: {exc}") from exc
    for name, kind in ENV_FIELDS.items():
        variable = f"SLUICE_{name.upper()}"
        value = os.environ.get(variable)
        if value:
            try:
                raw[name] = kind(value)
            except ValueError:
                raise SystemExit(f"sluice: invalid configuration: {variable}={value[:40]!r} is not "
                                 f"{'an integer' if kind is int else 'valid'}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return msgspec.convert(raw, Settings)
    except msgspec.ValidationError as exc:
        where = config_file or "the environment"
        raise SystemExit(f"sluice: invalid configuration in {where}: {exc} (the fields are listed under "
                         "Configuration in README.md)") from exc
