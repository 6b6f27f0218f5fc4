"""The fleet's shared state (fleet.py) in PostgreSQL, for a fleet whose gateways share a PostgreSQL database but
no Redis. The same rules as `RedisFleet`, one transaction per operation, times from the database server's
clock (no skew between gateways); the transactions of one endpoint (of one ECS call scope) hold its advisory
lock, so they run one at a time across the fleet while other endpoints' go on:

- `fleet_leases`: one row per endpoint, never deleted; a new holder takes an expired (or free) row and
  increments its `token`, so tokens only grow; `fenced` is the newest token that wrote.
- `fleet_reports`: one row per (endpoint, gateway) with its expiry; expired rows are deleted by the next sync.
- `fleet_replicas`, `fleet_draining`: the owner's replica list and its draining marks.
- `fleet_calls`: ECS API calls per (scope, wall-clock second).
"""

from __future__ import annotations

import math

import msgspec

import storage
from gateway.endpoints.fleet import Fleet, Replicas, Report
from storage import Database, Migration, Schema

SCHEMA = Schema("fleet", [
    Migration(1, "what the gateways of a fleet share per endpoint", [
        """CREATE TABLE fleet_leases (
            endpoint TEXT PRIMARY KEY, holder TEXT NOT NULL, token BIGINT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL, fenced BIGINT NOT NULL)""",
        """CREATE TABLE fleet_reports (
            endpoint TEXT NOT NULL, gateway TEXT NOT NULL, body TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (endpoint, gateway))""",
        "CREATE TABLE fleet_replicas (endpoint TEXT PRIMARY KEY, body TEXT NOT NULL)",
        "CREATE TABLE fleet_draining (endpoint TEXT NOT NULL, replica TEXT NOT NULL, PRIMARY KEY (endpoint, replica))",
        """CREATE TABLE fleet_calls (
            scope TEXT NOT NULL, second BIGINT NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (scope, second))""",
    ]),
], legacy_table="fleet_schema_migrations")
NOW = "SELECT CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)"
_report = msgspec.json.Decoder(Report)
_replicas = msgspec.json.Decoder(Replicas)


class PostgresFleet(Fleet):
    def __init__(self, db: Database, *, calls_per_second: float = 2.0, gateway_id: str | None = None):
        super().__init__(gateway_id)
        self._db = db
        self._calls_per_second = calls_per_second

    @classmethod
    async def open(cls, database_url: str, **options) -> PostgresFleet:
        db = await storage.open(database_url, store="fleet state (gateway database)")
        try:
            await storage.migrate(db, SCHEMA)
        except BaseException:
            await db.close()
            raise
        return cls(db, **options)

    async def sync(self, endpoint, report, ttl_s, lease_s):
        async with self._db.transaction(lock=f"fleet:{endpoint}") as tx:
            (now,) = await tx.fetchone(NOW)
            await tx.execute("""INSERT INTO fleet_reports (endpoint, gateway, body, expires_at) VALUES (?, ?, ?, ?)
                                ON CONFLICT (endpoint, gateway) DO UPDATE
                                SET body = excluded.body, expires_at = excluded.expires_at""",
                             (endpoint, self.gateway_id, msgspec.json.encode(report).decode(), now + ttl_s))
            await tx.execute("DELETE FROM fleet_reports WHERE endpoint = ? AND expires_at < ?", (endpoint, now))
            rows = await tx.fetchall("SELECT gateway, body FROM fleet_reports WHERE endpoint = ?", (endpoint,))
            token = await self._claim(tx, endpoint, now, lease_s)
        return token, {gateway: _report.decode(body) for gateway, body in rows}

    async def _claim(self, tx, endpoint: str, now: float, lease_s: float) -> int | None:
        held = await tx.fetchone("SELECT holder, token, expires_at FROM fleet_leases WHERE endpoint = ? FOR UPDATE",
                                 (endpoint,))
        if held is None:
            taken = await tx.fetchone("""INSERT INTO fleet_leases (endpoint, holder, token, expires_at, fenced)
                                         VALUES (?, ?, 1, ?, 0) ON CONFLICT (endpoint) DO NOTHING RETURNING token""",
                                      (endpoint, self.gateway_id, now + lease_s))
            return None if taken is None else int(taken[0])
        holder, token, expires_at = held
        if holder == self.gateway_id and expires_at >= now:
            await tx.execute("UPDATE fleet_leases SET expires_at = ? WHERE endpoint = ?", (now + lease_s, endpoint))
            return int(token)
        if expires_at >= now:
            return None
        await tx.execute("UPDATE fleet_leases SET holder = ?, token = ?, expires_at = ? WHERE endpoint = ?",
                         (self.gateway_id, token + 1, now + lease_s, endpoint))
        return int(token) + 1

    async def fence(self, endpoint, token):
        async with self._db.transaction(lock=f"fleet:{endpoint}") as tx:
            (now,) = await tx.fetchone(NOW)
            held = await tx.fetchone("""SELECT holder, token, expires_at, fenced FROM fleet_leases
                                        WHERE endpoint = ? FOR UPDATE""", (endpoint,))
            if held is None:
                return False
            holder, current, expires_at, fenced = held
            if holder != self.gateway_id or current != token or expires_at < now or token < fenced:
                return False
            await tx.execute("UPDATE fleet_leases SET fenced = ? WHERE endpoint = ?", (token, endpoint))
            return True

    async def resign(self, endpoint):
        async with self._db.transaction(lock=f"fleet:{endpoint}") as tx:
            await tx.execute("UPDATE fleet_leases SET expires_at = 0 WHERE endpoint = ? AND holder = ?",
                             (endpoint, self.gateway_id))
            await tx.execute("DELETE FROM fleet_reports WHERE endpoint = ? AND gateway = ?",
                             (endpoint, self.gateway_id))

    async def share(self, endpoint, replicas):
        await self._db.execute("""INSERT INTO fleet_replicas (endpoint, body) VALUES (?, ?)
                                  ON CONFLICT (endpoint) DO UPDATE SET body = excluded.body""",
                               (endpoint, msgspec.json.encode(replicas).decode()))

    async def shared(self, endpoint):
        row = await self._db.fetchone("SELECT body FROM fleet_replicas WHERE endpoint = ?", (endpoint,))
        return None if row is None else _replicas.decode(row[0])

    async def mark_draining(self, endpoint, replica_id):
        await self._db.execute("INSERT INTO fleet_draining (endpoint, replica) VALUES (?, ?) ON CONFLICT DO NOTHING",
                               (endpoint, replica_id))

    async def draining(self, endpoint):
        rows = await self._db.fetchall("SELECT replica FROM fleet_draining WHERE endpoint = ?", (endpoint,))
        return {replica for (replica,) in rows}

    async def forget_draining(self, endpoint, replica_ids):
        async with self._db.transaction(lock=f"fleet:{endpoint}") as tx:
            for replica in replica_ids:
                await tx.execute("DELETE FROM fleet_draining WHERE endpoint = ? AND replica = ?", (endpoint, replica))

    async def take_call(self, scope, calls=1):
        async with self._db.transaction(lock=f"fleet-calls:{scope}") as tx:
            (now,) = await tx.fetchone(NOW)
            second = math.floor(now)
            await tx.execute("INSERT INTO fleet_calls (scope, second, used) VALUES (?, ?, 0) ON CONFLICT DO NOTHING",
                             (scope, second))
            (used,) = await tx.fetchone("SELECT used FROM fleet_calls WHERE scope = ? AND second = ? FOR UPDATE",
                                        (scope, second))
            if used + calls > self._calls_per_second:
                return second + 1 - now
            await tx.execute("UPDATE fleet_calls SET used = ? WHERE scope = ? AND second = ?",
                             (used + calls, scope, second))
            await tx.execute("DELETE FROM fleet_calls WHERE scope = ? AND second < ?", (scope, second - 60))
            return 0.0

    async def close(self):
        await self._db.close()
