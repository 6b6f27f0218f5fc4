"""Settings: embedded defaults, overridden by a TOML file, then by SLUICE_* environment variables."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated

import msgspec

from common.protocol import ModelConfig


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str = ".data"
    database_url: str = ""  # "" = SQLite in the data dir; or postgresql://...
    redis_url: str = ""  # "" = in-process limiter; redis://... shares limits across gateways
    limiter_fail_open: bool = False
    pricing_file: str = ""  # TOML pricing table, re-read on change
    ledger_enabled: bool = True  # False: no usage records, no usage API (benchmarks only)
    wal_root: str = ""  # "" = the usage WAL in the data dir; a volume shared by gateways (EFS): billing/wal_home.py
    max_body_bytes: int = 4 * 1024 * 1024
    log_format: str = "json"  # "json" or "console"
    # SIGTERM: requests in flight get this long to finish, then the usage log drains (up to 10 s more)
    shutdown_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 10.0
    models: list[ModelConfig] = msgspec.field(default_factory=lambda: [ModelConfig()])

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_path / 'sluice.db'}"


ENV_FIELDS = {"host": str, "port": int, "data_dir": str, "database_url": str, "redis_url": str,
              "pricing_file": str, "log_format": str, "wal_root": str, "shutdown_grace_seconds": float}


def load_settings(config_file: str | None = None, **overrides) -> Settings:
    """Defaults < config file < SLUICE_<FIELD> environment < explicit overrides (CLI flags).

    Every mistake exits with one line naming it (SystemExit)."""
    raw: dict = {}
    inline = os.environ.get("SLUICE_CONFIG_TOML")  # the whole file in one variable (ECS task definitions)
    if config_file or inline:
        try:
            raw = tomllib.loads(Path(config_file).read_text() if config_file else inline)
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            where = f"file {config_file}" if config_file else "in SLUICE_CONFIG_TOML"
            raise SystemExit(f"sluice: cannot read the config {where}: {exc}") from exc
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
