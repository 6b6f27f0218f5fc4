"""The fleet's shared state (fleet.py) in PostgreSQL, for a fleet whose gateways share a PostgreSQL database but
no Redis. The same rules as `RedisFleet`, times from the database server's clock (no skew between gateways).
No advisory lock: each operation is one statement (or a transaction of row locks) on the rows of its own
endpoint, so the syncs of different endpoints never wait for each other and those of one endpoint wait only
for that endpoint's lease row (`INSERT ... ON CONFLICT DO UPDATE` locks it):

- `fleet_leases`: one row per endpoint, never deleted; a new holder takes an expired (or free) row and
  increments its `token`, so tokens only grow; `fenced` is the newest token that wrote.
- `fleet_reports`: one row per (endpoint, gateway) with its expiry; expired rows are deleted by the next sync.
- `fleet_replicas`, `fleet_draining`: the owner's replica list and its draining marks.
- `fleet_calls`: ECS API calls per (scope, wall-clock second).
- `fleet_failures`: a failed endpoint's reason, until cleared.
- `fleet_config`: one row, the config version; each bump also sends `NOTIFY sluice_fleet_config`, which every
  gateway LISTENs to on a connection of its own (`changes`); and the fleet's state version (`state_version`).
- `fleet_gateways`: each gateway's liveness (a report counts while its gateway is alive).
- `fleet_state`: each endpoint's state version; each change also sends `NOTIFY sluice_fleet_state` (the endpoint),
  and demand that appears `NOTIFY sluice_fleet_wake` (the endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import asyncpg
import msgspec

import storage
from gateway.endpoints.fleet import Changes, Failure, Fleet, Replicas, Report, Synced, Watch
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
    Migration(2, "failures and the endpoint config version, fleet-wide", [
        "CREATE TABLE fleet_failures (endpoint TEXT PRIMARY KEY, body TEXT NOT NULL)",
        "CREATE TABLE fleet_config (id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL)",
        "INSERT INTO fleet_config (id, version) VALUES (1, 0)",
    ]),
    Migration(3, "gateway liveness and state versions: idle gateways read only what changed", [
        "CREATE TABLE fleet_gateways (gateway TEXT PRIMARY KEY, expires_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE fleet_state (endpoint TEXT PRIMARY KEY, version BIGINT NOT NULL)",
        "ALTER TABLE fleet_config ADD COLUMN state_version BIGINT NOT NULL DEFAULT 0",
    ]),
], legacy_table="fleet_schema_migrations")
NOW = "SELECT CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)"
CHANNEL = "sluice_fleet_config"
STATE_CHANNEL, WAKE_CHANNEL = "sluice_fleet_state", "sluice_fleet_wake"
REPORT_KEEP_S = 86_400.0  # a report counts while its gateway is alive; this only bounds a forgotten one
GATEWAY_FORGET_S = 3600.0  # a gateway dead this long leaves fleet_gateways
LISTEN_CONNECT_S = 10.0
# One statement: publish the report, keep this gateway alive, drop the reports of dead gateways, take or renew the
# lease, read the live reports and the holder (a CTE sees the snapshot from before the statement: this gateway's
# fresh report is added by the caller, and a lease it just took is its own).
# ?1 endpoint, ?2 gateway, ?3 report body, ?4 liveness ttl, ?5 lease seconds, ?6 report keep, ?7 whether to renew
# this gateway's liveness (only when it may lapse: its row is one for all of this gateway's syncs)
_SYNC = """
WITH now AS (SELECT CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION) AS t),
published AS (
    INSERT INTO fleet_reports (endpoint, gateway, body, expires_at) SELECT ?1, ?2, ?3, t + ?6 FROM now
    ON CONFLICT (endpoint, gateway) DO UPDATE SET body = excluded.body, expires_at = excluded.expires_at),
beat AS (
    INSERT INTO fleet_gateways (gateway, expires_at) SELECT ?2, t + ?4 FROM now WHERE ?7
    ON CONFLICT (gateway) DO UPDATE SET expires_at = GREATEST(fleet_gateways.expires_at, excluded.expires_at)),
expired AS (
    DELETE FROM fleet_reports AS r WHERE endpoint = ?1 AND gateway <> ?2 AND (expires_at < (SELECT t FROM now)
        OR NOT EXISTS (SELECT 1 FROM fleet_gateways g
                       WHERE g.gateway = r.gateway AND g.expires_at >= (SELECT t FROM now)))),
claimed AS (
    INSERT INTO fleet_leases AS held (endpoint, holder, token, expires_at, fenced)
    SELECT ?1, ?2, 1, t + ?5, 0 FROM now
    ON CONFLICT (endpoint) DO UPDATE SET
        token = CASE WHEN held.holder = excluded.holder AND held.expires_at >= (SELECT t FROM now)
                     THEN held.token ELSE held.token + 1 END,
        holder = excluded.holder, expires_at = excluded.expires_at
    WHERE held.expires_at < (SELECT t FROM now) OR held.holder = excluded.holder
    RETURNING token)
SELECT NULL, (SELECT token FROM claimed),
       (SELECT holder FROM fleet_leases WHERE endpoint = ?1 AND expires_at >= (SELECT t FROM now))
UNION ALL
SELECT gateway, NULL, body FROM fleet_reports AS r
WHERE endpoint = ?1 AND gateway <> ?2 AND expires_at >= (SELECT t FROM now)
  AND EXISTS (SELECT 1 FROM fleet_gateways g WHERE g.gateway = r.gateway AND g.expires_at >= (SELECT t FROM now))
"""
# ?1 gateway, ?2 endpoints, ?3 their tokens, ?4 lease seconds: renew each lease this gateway holds with that token and
# that has not lapsed (as _SYNC renews one); the endpoints renewed.
_RENEW = """
UPDATE fleet_leases AS held SET expires_at = CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION) + ?4
FROM unnest(CAST(?2 AS TEXT[]), CAST(?3 AS BIGINT[])) AS ours (endpoint, token)
WHERE held.endpoint = ours.endpoint AND held.token = ours.token AND held.holder = ?1
  AND held.expires_at >= CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)
RETURNING held.endpoint
"""
# ?1 gateway, ?2 liveness ttl, ?3 forget after: this gateway is alive; the state version and the gateways alive.
_WATCH = """
WITH now AS (SELECT CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION) AS t),
beat AS (
    INSERT INTO fleet_gateways (gateway, expires_at) SELECT ?1, t + ?2 FROM now
    ON CONFLICT (gateway) DO UPDATE SET expires_at = GREATEST(fleet_gateways.expires_at, excluded.expires_at)),
forgotten AS (DELETE FROM fleet_gateways WHERE expires_at < (SELECT t FROM now) - ?3)
SELECT (SELECT state_version FROM fleet_config WHERE id = 1),
       ARRAY(SELECT gateway FROM fleet_gateways WHERE expires_at >= (SELECT t FROM now))
"""
# ?1 endpoint: count a change of its shared state, record it, name it on the state channel (sent at commit)
_BUMP_STATE = f"""
WITH bumped AS (UPDATE fleet_config SET state_version = state_version + 1 WHERE id = 1 RETURNING state_version),
recorded AS (
    INSERT INTO fleet_state (endpoint, version) SELECT ?1, state_version FROM bumped
    ON CONFLICT (endpoint) DO UPDATE SET version = excluded.version)
SELECT state_version FROM bumped, pg_notify('{STATE_CHANNEL}', ?1) AS sent
"""
# ?1 scope, ?2 second, ?3 calls, ?4 limit: count the calls if the second has room for all of them.
_TAKE_CALL = """
INSERT INTO fleet_calls AS taken (scope, second, used)
SELECT ?1, ?2, CAST(?3 AS INTEGER) WHERE CAST(?3 AS INTEGER) <= CAST(?4 AS DOUBLE PRECISION)
ON CONFLICT (scope, second) DO UPDATE SET used = taken.used + excluded.used
WHERE taken.used + excluded.used <= CAST(?4 AS DOUBLE PRECISION)
RETURNING used
"""
_report = msgspec.json.Decoder(Report)
_replicas = msgspec.json.Decoder(Replicas)
_failure = msgspec.json.Decoder(Failure)


class PostgresFleet(Fleet):
    def __init__(self, db: Database, *, calls_per_second: float = 2.0, gateway_id: str | None = None,
                 listen_url: str = ""):
        """`listen_url`: the database to LISTEN on for config changes ("": none, `config_changed` only waits)."""
        super().__init__(gateway_id)
        self._db = db
        self._calls_per_second = calls_per_second
        self._listen_url = listen_url
        self._listener: asyncpg.Connection | None = None
        self._notified = asyncio.Event()
        self._alive_until = -math.inf  # monotonic: this gateway's liveness lasts until then at least
        self._heard: dict[str, set[str]] = {CHANNEL: set(), STATE_CHANNEL: set(), WAKE_CHANNEL: set()}

    @classmethod
    async def open(cls, database_url: str, **options) -> PostgresFleet:
        db = await storage.open(database_url, store="fleet state (gateway database)")
        try:
            await storage.migrate(db, SCHEMA)
        except BaseException:
            await db.close()
            raise
        return cls(db, listen_url=database_url, **options)

    async def sync(self, endpoint, report, ttl_s, lease_s):
        body = msgspec.json.encode(report).decode()
        started = time.monotonic()
        beat = started + ttl_s / 2 > self._alive_until
        rows = await self._db.fetchall(_SYNC, (endpoint, self.gateway_id, body, ttl_s, lease_s, REPORT_KEEP_S, beat))
        if beat:
            self._alive_until = started + ttl_s
        token, holder = rows[0][1], rows[0][2]
        reports = {gateway: _report.decode(text) for gateway, _, text in rows[1:]}
        reports[self.gateway_id] = report
        if token is not None:
            return Synced(int(token), reports, self.gateway_id)
        return Synced(None, reports, holder)

    async def renew(self, leases, lease_s):
        if not leases:
            return set()
        endpoints = list(leases)
        rows = await self._db.fetchall(_RENEW, (self.gateway_id, endpoints, [leases[e] for e in endpoints], lease_s))
        return {endpoint for (endpoint,) in rows}

    async def watch(self, ttl_s):
        started = time.monotonic()
        version, alive = await self._db.fetchone(_WATCH, (self.gateway_id, ttl_s, GATEWAY_FORGET_S))
        self._alive_until = started + ttl_s
        return Watch(int(version), set(alive))

    async def state_versions(self):
        return {endpoint: int(version) for endpoint, version in
                await self._db.fetchall("SELECT endpoint, version FROM fleet_state")}

    async def _changed(self, endpoint: str) -> None:
        await self._db.fetchone(_BUMP_STATE, (endpoint,))

    async def wake(self, endpoint):
        await self._db.fetchone(f"SELECT pg_notify('{WAKE_CHANNEL}', ?)", (endpoint,))

    async def fence(self, endpoint, token):
        async with self._db.transaction() as tx:
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
        async with self._db.transaction() as tx:
            await tx.execute("UPDATE fleet_leases SET expires_at = 0 WHERE endpoint = ? AND holder = ?",
                             (endpoint, self.gateway_id))
            await tx.execute("DELETE FROM fleet_reports WHERE endpoint = ? AND gateway = ?",
                             (endpoint, self.gateway_id))
        await self._changed(endpoint)  # the others take the lease at once

    async def share(self, endpoint, replicas):
        await self._db.execute("""INSERT INTO fleet_replicas (endpoint, body) VALUES (?, ?)
                                  ON CONFLICT (endpoint) DO UPDATE SET body = excluded.body""",
                               (endpoint, msgspec.json.encode(replicas).decode()))
        await self._changed(endpoint)

    async def shared(self, endpoint):
        row = await self._db.fetchone("SELECT body FROM fleet_replicas WHERE endpoint = ?", (endpoint,))
        return None if row is None else _replicas.decode(row[0])

    async def mark_draining(self, endpoint, replica_id):
        await self._db.execute("INSERT INTO fleet_draining (endpoint, replica) VALUES (?, ?) ON CONFLICT DO NOTHING",
                               (endpoint, replica_id))
        await self._changed(endpoint)

    async def draining(self, endpoint):
        rows = await self._db.fetchall("SELECT replica FROM fleet_draining WHERE endpoint = ?", (endpoint,))
        return {replica for (replica,) in rows}

    async def forget_draining(self, endpoint, replica_ids):
        if replica_ids:
            await self._db.execute("DELETE FROM fleet_draining WHERE endpoint = ? AND replica = ANY(?)",
                                   (endpoint, sorted(replica_ids)))
            await self._changed(endpoint)

    async def take_call(self, scope, calls=1):
        (now,) = await self._db.fetchone(NOW)
        second = math.floor(now)
        taken = await self._db.fetchone(_TAKE_CALL, (scope, second, calls, self._calls_per_second))
        if second % 60 == 0:  # old windows, once a minute
            await self._db.execute("DELETE FROM fleet_calls WHERE scope = ? AND second < ?", (scope, second - 60))
        return 0.0 if taken is not None else second + 1 - now

    async def mark_failed(self, endpoint, failure):
        await self._db.execute("""INSERT INTO fleet_failures (endpoint, body) VALUES (?, ?)
                                  ON CONFLICT (endpoint) DO UPDATE SET body = excluded.body""",
                               (endpoint, msgspec.json.encode(failure.bounded()).decode()))
        await self._changed(endpoint)

    async def failure(self, endpoint):
        row = await self._db.fetchone("SELECT body FROM fleet_failures WHERE endpoint = ?", (endpoint,))
        return None if row is None else _failure.decode(row[0])

    async def clear_failed(self, endpoint):
        await self._db.execute("DELETE FROM fleet_failures WHERE endpoint = ?", (endpoint,))
        await self._changed(endpoint)

    async def config_version(self):
        (version,) = await self._db.fetchone("SELECT version FROM fleet_config WHERE id = 1")
        return int(version)

    async def bump_config(self):
        # the NOTIFY goes out when the statement's transaction commits, with the new version stored
        (version,) = await self._db.fetchone(f"""WITH bumped AS (
            UPDATE fleet_config SET version = version + 1 WHERE id = 1 RETURNING version)
            SELECT version FROM bumped, pg_notify('{CHANNEL}', CAST(version AS TEXT)) AS sent""")
        return int(version)

    async def changes(self, timeout):
        if self._listen_url and (self._listener is None or self._listener.is_closed()):
            await self._close_listener()  # a lost connection: listen afresh
            self._listener = await asyncpg.connect(self._listen_url, timeout=LISTEN_CONNECT_S)
            for channel in self._heard:
                await self._listener.add_listener(channel, self._heard_on)
            # a change before the LISTEN sent no message here: the caller looks at the versions now
            return Changes(config=True, relisten=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._notified.wait()
        self._notified.clear()
        config, state, wake = (self._heard[c] for c in (CHANNEL, STATE_CHANNEL, WAKE_CHANNEL))
        heard = Changes(bool(config), frozenset(state), frozenset(wake))
        for said in self._heard.values():
            said.clear()
        return heard

    def _heard_on(self, connection: object, pid: int, channel: str, payload: str) -> None:
        self._heard[channel].add(payload or "-")
        self._notified.set()

    async def _close_listener(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close(timeout=LISTEN_CONNECT_S)

    async def close(self):
        await self._close_listener()
        await self._db.close()
