"""A database made before the one bookkeeping table keeps working: each package's old table (auth, endpoints,
fleet, stored responses: version/description/applied_at; billing: version/applied_at) is adopted into
`schema_migrations` and dropped; versions recorded there are not applied again, later ones are.

The old database is written here with the driver itself, exactly as the code before storage's runner left it."""

from __future__ import annotations

import asyncio

import asyncpg

import storage
from auth.store import open_store as open_auth_store
from auth.store.migrations import SCHEMA as AUTH
from billing.store import open_store as open_usage_store
from billing.store.schema import SCHEMA as BILLING
from gateway.dialects.responses.store import SCHEMA as RESPONSES
from gateway.dialects.responses.store import response_store
from gateway.endpoints.fleet_postgres import SCHEMA as FLEET
from gateway.endpoints.fleet_postgres import PostgresFleet
from gateway.endpoints.store import SCHEMA as ENDPOINTS
from gateway.endpoints.store import EndpointStore
from storage import Database, Schema
from storage.migrations import TABLE
from storage.registry import connect, parse

OLD_TABLE = ("CREATE TABLE {table} (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
             "applied_at DOUBLE PRECISION NOT NULL)")
OLD_BILLING_TABLE = "CREATE TABLE {table} (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
TABLES = {"sqlite": "SELECT name FROM sqlite_master WHERE type = 'table'",
          "postgres": "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"}
# (schema, versions the old database holds); auth, billing, endpoints and responses are behind the code
OLD = [(AUTH, [1, 2]), (BILLING, [1, 2, 3]), (ENDPOINTS, [1]), (RESPONSES, [1])]
OLD_POSTGRES = [*OLD, (FLEET, [1])]  # the fleet's state lives only in PostgreSQL
DATA = ["INSERT INTO teams (id, name, limits, created_at) VALUES ('team_old', 'old team', NULL, 1.0)",
        "INSERT INTO endpoints (name, origin, body, updated_at) VALUES ('old-endpoint', 'api', '{}', 1.0)",
        "INSERT INTO stored_responses (team_id, id, created_at, response, messages) "
        "VALUES ('team_old', 'resp_old', 1.0, '{\"é\": 1}', '[]')"]


def old_statements(dialect: str) -> list[str]:
    statements = []
    for schema, versions in OLD_POSTGRES if dialect == "postgres" else OLD:
        table = schema.legacy_table
        ddl = OLD_BILLING_TABLE if schema is BILLING else OLD_TABLE
        statements.append(ddl.format(table=table))
        for migration in schema.migrations:
            if migration.version in versions:
                statements += migration.sql(dialect)
                if schema is BILLING:
                    statements.append(f"INSERT INTO {table} VALUES ({migration.version}, {migration.version * 1000})")
                else:
                    statements.append(f"INSERT INTO {table} VALUES ({migration.version}, 'old', "
                                      f"{migration.version * 1000})")
    return statements + DATA


async def write_old_database(url: str) -> None:
    dialect, where = parse(url)
    if dialect == "sqlite":
        import sqlite3

        conn = sqlite3.connect(where)
        for statement in old_statements("sqlite"):
            conn.execute(statement)
        conn.commit()
        conn.close()
        return
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            for statement in old_statements("postgres"):
                await conn.execute(statement)
    finally:
        await conn.close()


async def versions(db: Database, schema: Schema) -> list[tuple[int, float]]:
    return await db.fetchall(f"SELECT version, applied_at FROM {TABLE} WHERE package = ? ORDER BY version",
                             (schema.package,))


async def test_a_database_of_the_old_tables_upgrades(database_url):
    await write_old_database(database_url)
    auth = await open_auth_store(database_url)
    usage = await open_usage_store(database_url)
    endpoints = await EndpointStore.open(database_url)
    fleet = await PostgresFleet.open(database_url) if auth.db.dialect == "postgres" else None
    try:
        await response_store(auth.db).get("team_old", "resp_none")  # migrates on first use
        db = auth.db
        # the versions recorded before keep their times; the missing ones were applied now
        auth_versions = await versions(db, AUTH)
        assert [v for v, _ in auth_versions] == [1, 2, 3, 4, 5] and auth_versions[:2] == [(1, 1000), (2, 2000)]
        # 4: budget_alerts, 5: finish_reason, 6: budget_refused, 7: client_request_id, 8: cached tokens and batches,
        # 9: prediction tokens, 10: end users and tags, 11: hourly latency histograms and health alert states
        billing_versions = await versions(db, BILLING)
        assert [v for v, _ in billing_versions] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        assert billing_versions[:3] == [(1, 1000), (2, 2000), (3, 3000)]
        endpoint_versions = await versions(db, ENDPOINTS)
        assert [v for v, _ in endpoint_versions] == [1, 2] and endpoint_versions[0] == (1, 1000)
        # 2: stored bytes, counted for the team's quota; 3: every team's total, for the fleet-wide bound
        responses_versions = await versions(db, RESPONSES)
        assert [v for v, _ in responses_versions] == [1, 2, 3] and responses_versions[0] == (1, 1000)
        assert await db.fetchone("SELECT bytes FROM stored_responses WHERE id = 'resp_old'") == (11,)  # UTF-8 bytes
        assert await response_store(auth.db).total_bytes() == 11  # seeded from the rows already stored
        if fleet is not None:  # 2: failures and the config version, fleet-wide; 3: liveness and state versions
            fleet_versions = await versions(db, FLEET)
            assert [v for v, _ in fleet_versions] == [1, 2, 3] and fleet_versions[0] == (1, 1000)
            assert await fleet.config_version() == 0 and await fleet.failure("old-endpoint") is None
            assert (await fleet.watch(10)).state_version == 0 and await fleet.state_versions() == {}
        # the old rows are there, and so are the tables of the versions applied now
        assert (await auth.get_team("team_old")).name == "old team"
        assert [row.name for row in await endpoints.rows()] == ["old-endpoint"]
        assert await auth.blocked_keys("team_old") == []  # key_blocks: auth's version 3
        assert await endpoints.adapters() == []  # endpoint_adapters: the endpoints' version 2
        assert await usage.count(["none"]) == {"none": 0}
        # the old tables are gone: one bookkeeping table
        tables = {name for (name,) in await db.fetchall(TABLES[db.dialect])}
        assert TABLE in tables and "usage_records" in tables and "budget_alerts" in tables
        assert {"usage_hourly_latency", "health_alert_states"} <= tables  # billing's version 11
        assert not tables & {schema.legacy_table for schema, _ in OLD_POSTGRES}
    finally:
        for store in (auth, usage, endpoints, fleet):
            if store is not None:
                await store.close()
    again = await open_auth_store(database_url)  # nothing is applied twice
    try:
        assert [v for v, _ in await versions(again.db, AUTH)] == [1, 2, 3, 4, 5]
    finally:
        await again.close()


async def test_gateways_upgrading_one_old_database_together_adopt_it_once(database_url):
    await write_old_database(database_url)
    dbs = [Database(await connect(database_url)) for _ in range(4)]  # pools of their own, as processes have
    try:
        applied = await asyncio.gather(*(storage.migrate(db, AUTH) for db in dbs))
        assert sorted(applied) == [[], [], [], [3, 4, 5]]
        assert [v for v, _ in await versions(dbs[0], AUTH)] == [1, 2, 3, 4, 5]
    finally:
        for db in dbs:
            await db.close()
