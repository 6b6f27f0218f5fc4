"""`sluice usage …`: usage exports and statements for an operator with access to the database.

    sluice usage export [--date YYYY-MM-DD] --bucket B [--prefix P] [--team-id T ...] [--endpoint-url URL]
    sluice usage statement --team-id T --month YYYY-MM [--format csv|json]

`export` writes each team's records of one UTC day (default: yesterday) to
`s3://B/<prefix><team>/<day>.jsonl.gz`; rerunning it is safe (billing/exports/s3.py). Credentials
and region come from the usual AWS settings (environment, profile, instance role).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import boto3
import msgspec
import structlog
from botocore.exceptions import BotoCoreError, ClientError

from billing.exports.csv import statement_csv
from billing.exports.s3 import export_day
from billing.statements import monthly_statement
from billing.store import open_store
from billing.store.base import UsageStore

# what a bad bucket, credentials, endpoint or database URL raises: one line and exit 1, no traceback
_T = TypeVar("_T")
_FAILURES = (BotoCoreError, ClientError, OSError, sqlite3.Error, asyncpg.PostgresError, ValueError)


def register(subparsers: Any) -> None:  # argparse's _SubParsersAction
    usage = subparsers.add_parser("usage", help="usage exports and statements")
    commands = usage.add_subparsers(dest="usage_command", required=True)
    export = commands.add_parser("export", help="export a UTC day's usage records to S3, one object per team")
    export.add_argument("--date", type=_day, default=None, help="the UTC day (default: yesterday)")
    export.add_argument("--bucket", required=True)
    export.add_argument("--prefix", default="", help="key prefix, e.g. 'usage/'")
    export.add_argument("--team-id", dest="team_ids", action="append", help="only this team (repeat)")
    export.add_argument("--endpoint-url", help="an S3-compatible endpoint (default: AWS)")
    export.add_argument("--json", action="store_true", help="print JSON instead of a table")
    export.set_defaults(func=_run_export)
    statement = commands.add_parser("statement", help="print a team's monthly statement")
    statement.add_argument("--team-id", required=True)
    statement.add_argument("--month", required=True, help="YYYY-MM (UTC)")
    statement.add_argument("--format", choices=["csv", "json"], default="csv")
    statement.set_defaults(func=_run_statement)


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM-DD, got {text!r}") from None


def _quiet_logs() -> None:
    if not structlog.is_configured():  # stdout carries the result
        structlog.configure(logger_factory=lambda *_: structlog.PrintLogger(sys.stderr))


async def _with_store(database_url: str, work: Callable[[UsageStore], Awaitable[_T]]) -> _T:
    store = await open_store(database_url)
    try:
        return await work(store)
    finally:
        await store.close()


def _run_export(args: argparse.Namespace) -> int:
    _quiet_logs()
    day = args.date or (datetime.now(UTC) - timedelta(days=1)).date()
    s3 = boto3.client("s3", endpoint_url=args.endpoint_url)

    try:
        exported = asyncio.run(_with_store(args.database_url, lambda store: export_day(
            store, s3, args.bucket, day, prefix=args.prefix, team_ids=args.team_ids)))
    except _FAILURES as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(msgspec.json.encode(exported).decode())
    else:
        for obj in exported:
            state = "written" if obj.uploaded else "unchanged"
            print(f"s3://{args.bucket}/{obj.key}  {obj.records} records  {obj.bytes} bytes  {state}")
        print(f"{len(exported)} team(s) exported for {day.isoformat()}")
    return 0


def _run_statement(args: argparse.Namespace) -> int:
    _quiet_logs()

    try:
        statement = asyncio.run(_with_store(args.database_url,
                                            lambda store: monthly_statement(store, args.team_id, args.month)))
    except _FAILURES as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(statement_csv(statement) if args.format == "csv" else msgspec.json.encode(statement).decode(), end="")
    if args.format == "json":
        print()
    return 0
