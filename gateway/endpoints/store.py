"""Endpoints changed at run time, and the LoRA adapters registered on them through the admin API, kept in the
gateway's database (SQLite file or PostgreSQL URL).

`endpoints`: one row per endpoint name. `origin = "api"`: the endpoint was created through the admin API and the
row holds its whole spec. `origin = "config"`: the config file declares it and the row holds only the
fields a PATCH changed (registry.py says how the two combine).
`endpoint_adapters`: one row per (endpoint, adapter name) registered through the API (gateway/endpoints/adapters.py says
how they combine with the adapters an endpoint's spec declares).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec

import storage
from storage import Database, Migration, Schema

Origin = Literal["api", "config"]
SCHEMA = Schema("endpoints", [
    Migration(1, "endpoints created or patched at run time", [
        """CREATE TABLE endpoints (
            name TEXT PRIMARY KEY, origin TEXT NOT NULL, body TEXT NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL)""",
    ]),
    Migration(2, "LoRA adapters registered through the admin API", [
        """CREATE TABLE endpoint_adapters (
            endpoint TEXT NOT NULL, name TEXT NOT NULL, source TEXT NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (endpoint, name))""",
    ]),
], legacy_table="endpoint_schema_migrations")
_body = msgspec.json.Decoder(dict[str, Any])


class StoredEndpoint(msgspec.Struct, frozen=True):
    name: str
    origin: Origin
    body: dict[str, Any]  # the spec (api) or the patched fields (config), as JSON builtins
    updated_at: float


class StoredAdapter(msgspec.Struct, frozen=True):
    endpoint: str
    name: str
    source: str


class EndpointStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    @classmethod
    async def open(cls, database_url: str) -> EndpointStore:
        db = await storage.open(database_url, store="endpoint store (gateway database)")
        try:
            await storage.migrate(db, SCHEMA)
        except BaseException:
            await db.close()  # an unclosed SQLite connection's thread keeps the process alive
            raise
        return cls(db)

    async def rows(self) -> list[StoredEndpoint]:
        found = await self._db.fetchall("SELECT name, origin, body, updated_at FROM endpoints ORDER BY name")
        return [StoredEndpoint(name, origin, _body.decode(body), updated_at)
                for name, origin, body, updated_at in found]

    async def put(self, name: str, origin: Origin, body: dict[str, Any]) -> None:
        text = msgspec.json.encode(body).decode()
        async with self._db.transaction(lock=f"endpoint:{name}") as tx:  # an upsert both databases spell alike
            await tx.execute("DELETE FROM endpoints WHERE name = ?", (name,))
            await tx.execute("INSERT INTO endpoints (name, origin, body, updated_at) VALUES (?, ?, ?, ?)",
                             (name, origin, text, time.time()))

    async def insert(self, name: str, origin: Origin, body: dict[str, Any]) -> bool:
        """Store a new row; False when the name has one already (another gateway created it meanwhile)."""
        try:
            await self._db.execute("INSERT INTO endpoints (name, origin, body, updated_at) VALUES (?, ?, ?, ?)",
                                   (name, origin, msgspec.json.encode(body).decode(), time.time()))
        except storage.Conflict:
            return False
        return True

    async def remove(self, name: str) -> None:
        await self._db.execute("DELETE FROM endpoints WHERE name = ?", (name,))

    async def adapters(self) -> list[StoredAdapter]:
        found = await self._db.fetchall("SELECT endpoint, name, source FROM endpoint_adapters ORDER BY endpoint, name")
        return [StoredAdapter(endpoint, name, source) for endpoint, name, source in found]

    async def put_adapter(self, endpoint: str, name: str, source: str) -> None:
        async with self._db.transaction(lock=f"adapter:{endpoint}:{name}") as tx:
            await tx.execute("DELETE FROM endpoint_adapters WHERE endpoint = ? AND name = ?", (endpoint, name))
            await tx.execute("INSERT INTO endpoint_adapters (endpoint, name, source, updated_at) VALUES (?, ?, ?, ?)",
                             (endpoint, name, source, time.time()))

    async def remove_adapter(self, endpoint: str, name: str) -> None:
        await self._db.execute("DELETE FROM endpoint_adapters WHERE endpoint = ? AND name = ?", (endpoint, name))

    async def remove_adapters(self, endpoint: str) -> None:
        await self._db.execute("DELETE FROM endpoint_adapters WHERE endpoint = ?", (endpoint,))

    async def close(self) -> None:
        await self._db.close()
