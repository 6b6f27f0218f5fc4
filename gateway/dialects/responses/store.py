"""Stored responses (`store: true`, OpenAI's default): one row per response, in the gateway's database (the auth
store's), keyed by team. `GET` / `DELETE /v1/responses/{id}` and `previous_response_id` read only the caller's
team's rows: another team's id is as unknown as one that never existed.

A row holds the response object as answered and the conversation it continued (`messages`: the worker's chat
turns, its own output included), so `previous_response_id` replays the whole chain without walking it.
Its table has its own schema versions (package `responses`), applied on first use by each process."""

from __future__ import annotations

import asyncio
import time

import msgspec

import storage
from storage import Database, Migration, Schema

SCHEMA = Schema("responses", [
    Migration(1, "stored responses", ["""CREATE TABLE IF NOT EXISTS stored_responses (
        team_id TEXT NOT NULL, id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        response TEXT NOT NULL, messages TEXT NOT NULL, PRIMARY KEY (team_id, id))"""]),
], legacy_table="responses_schema_migrations")


class StoredResponse(msgspec.Struct):
    response: dict
    messages: list[dict]


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._ready = False
        self._lock = asyncio.Lock()

    async def _migrated(self) -> Database:
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await storage.migrate(self.db, SCHEMA)
                    self._ready = True
        return self.db

    async def save(self, team_id: str, response: dict, messages: list[dict]) -> None:
        db = await self._migrated()
        async with db.transaction() as tx:
            await tx.execute("INSERT INTO stored_responses (team_id, id, created_at, response, messages) "
                             "VALUES (?, ?, ?, ?, ?)",
                             (team_id, response["id"], time.time(), msgspec.json.encode(response).decode(),
                              msgspec.json.encode(messages).decode()))

    async def get(self, team_id: str, response_id: str) -> StoredResponse | None:
        db = await self._migrated()
        row = await db.fetchone("SELECT response, messages FROM stored_responses WHERE team_id = ? AND id = ?",
                                (team_id, response_id))
        if row is None:
            return None
        return StoredResponse(msgspec.json.decode(row[0]), msgspec.json.decode(row[1]))

    async def delete(self, team_id: str, response_id: str) -> bool:
        db = await self._migrated()
        if await self.get(team_id, response_id) is None:
            return False
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM stored_responses WHERE team_id = ? AND id = ?", (team_id, response_id))
        return True


_stores: dict[int, ResponseStore] = {}


def response_store(db: Database) -> ResponseStore:
    """The one ResponseStore of a database (its migrations run once per process)."""
    store = _stores.get(id(db))
    if store is None or store.db is not db:
        store = _stores[id(db)] = ResponseStore(db)
    return store
