"""`sluice users|teams|keys …`: the admin operations for an operator with shell access to the database."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog

from auth.admin import Actor, AdminOps
from auth.errors import RequestError
from auth.models import CreateKey, CreateTeam, CreateUser, Limits, PatchTeam, PutMember, RotateKey
from auth.service import AuthService

_LIMIT_FLAGS = ("rpm", "tpm", "max_concurrency", "monthly_token_budget")
Op = Callable[[AdminOps, Actor, argparse.Namespace], Awaitable[object]]


def register(subparsers: Any) -> None:  # argparse's _SubParsersAction
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    limits = argparse.ArgumentParser(add_help=False)
    for flag in _LIMIT_FLAGS:
        limits.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int, metavar="N")

    users = _group(subparsers, "users", "manage users")
    _leaf(users, "create", "create a user", common, _create_user).add_argument("name")
    _leaf(users, "list", "list users", common, lambda ops, actor, a: ops.list_users())

    teams = _group(subparsers, "teams", "manage teams and memberships")
    _leaf(teams, "create", "create a team", [common, limits], _create_team).add_argument("name")
    _leaf(teams, "list", "list teams", common, lambda ops, actor, a: ops.list_teams())
    update = _leaf(teams, "update", "rename a team or change its limits", [common, limits], _update_team)
    update.add_argument("team_id")
    update.add_argument("--name")
    update.add_argument("--clear-limits", action="store_true", help="remove every team limit")
    _leaf(teams, "members", "list a team's members", common,
          lambda ops, actor, a: ops.list_members(a.team_id)).add_argument("team_id")
    add = _leaf(teams, "add-member", "add a user to a team (or change their role)", common,
                lambda ops, actor, a: ops.put_member(actor, a.team_id, a.user_id, PutMember(role=a.role)))
    add.add_argument("team_id")
    add.add_argument("user_id")
    add.add_argument("--role", choices=["owner", "member"], default="member")
    remove = _leaf(teams, "remove-member", "remove a user from a team", common, _remove_member)
    remove.add_argument("team_id")
    remove.add_argument("user_id")

    keys = _group(subparsers, "keys", "manage API keys")
    create = _leaf(keys, "create", "create a key (the clear key is printed once)", [common, limits], _create_key)
    create.add_argument("--name", required=True)
    create.add_argument("--team-id")
    create.add_argument("--user-id")
    create.add_argument("--model", dest="models", action="append", default=[], help="allowed model (repeat)")
    create.add_argument("--expires-at", help="ISO 8601 time, e.g. 2030-01-31T00:00:00Z")
    create.add_argument("--admin", action="store_true", help="an admin key (may call /admin)")
    _leaf(keys, "list", "list keys", common, lambda ops, actor, a: ops.list_keys(a.team_id)).add_argument("--team-id")
    _leaf(keys, "revoke", "revoke a key", common,
          lambda ops, actor, a: ops.revoke_key(actor, a.key_id)).add_argument("key_id")
    rotate = _leaf(keys, "rotate", "replace a key; the old one works for the grace period", common,
                   lambda ops, actor, a: ops.rotate_key(actor, a.key_id, RotateKey(grace_seconds=a.grace_seconds)))
    rotate.add_argument("key_id")
    rotate.add_argument("--grace-seconds", type=int, default=0)


def _group(subparsers: Any, name: str, help_text: str) -> Any:
    parser = subparsers.add_parser(name, help=help_text)
    children = parser.add_subparsers(dest=f"{name}_command", required=True)
    return children


def _leaf(group: Any, name: str, help_text: str, parents: argparse.ArgumentParser | list[argparse.ArgumentParser],
          op: Op) -> argparse.ArgumentParser:
    parents = parents if isinstance(parents, list) else [parents]
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text, parents=parents)
    parser.set_defaults(func=lambda args: _run(args, op))
    return parser


def _limits(args: argparse.Namespace) -> Limits | None:
    values = {f: getattr(args, f) for f in _LIMIT_FLAGS if getattr(args, f, None) is not None}
    return msgspec.convert(values, Limits) if values else None


async def _create_user(ops: AdminOps, actor: Actor, args: argparse.Namespace) -> object:
    return await ops.create_user(actor, msgspec.convert({"name": args.name}, CreateUser))


async def _create_team(ops: AdminOps, actor: Actor, args: argparse.Namespace) -> object:
    body = {"name": args.name, "limits": msgspec.to_builtins(_limits(args))}
    return await ops.create_team(actor, msgspec.convert(body, CreateTeam))


async def _update_team(ops: AdminOps, actor: Actor, args: argparse.Namespace) -> object:
    changes: dict[str, Any] = {}
    if args.name is not None:
        changes["name"] = args.name
    if args.clear_limits:
        changes["limits"] = None
    elif _limits(args) is not None:
        changes["limits"] = msgspec.to_builtins(_limits(args))
    return await ops.update_team(actor, args.team_id, msgspec.convert(changes, PatchTeam))


async def _remove_member(ops: AdminOps, actor: Actor, args: argparse.Namespace) -> object:
    await ops.delete_member(actor, args.team_id, args.user_id)
    return {"team_id": args.team_id, "user_id": args.user_id, "deleted": True}


async def _create_key(ops: AdminOps, actor: Actor, args: argparse.Namespace) -> object:
    body = msgspec.convert({"name": args.name, "team_id": args.team_id, "user_id": args.user_id,
                            "models": args.models, "expires_at": args.expires_at, "is_admin": args.admin,
                            "limits": msgspec.to_builtins(_limits(args))}, CreateKey)
    return await ops.create_key(actor, body)


def _run(args: argparse.Namespace, op: Op) -> int:
    if not structlog.is_configured():
        # Keep stdout for the table or JSON, so `--json` output stays parseable.
        structlog.configure(logger_factory=lambda *_: structlog.PrintLogger(sys.stderr))
    try:
        result = asyncio.run(_call(args, op))
    except (RequestError, msgspec.ValidationError, ValueError) as exc:
        message: object = getattr(exc, "message", exc)
        print(f"error: {message}", file=sys.stderr)
        return 1
    _print(result, args.json)
    key: object = getattr(result, "key", None)
    if not args.json and key:
        print(f"\nkey (shown once, store it now): {key}")
    return 0


async def _call(args: argparse.Namespace, op: Op) -> object:
    service = await AuthService.open(args.database_url, args.pepper)
    try:
        return await op(service.admin, Actor(id=f"cli:{getpass.getuser()}", source="cli"), args)
    finally:
        await service.close()


def _print(result: object, as_json: bool) -> None:
    if as_json:
        print(msgspec.json.encode(result).decode())
        return
    results = result if isinstance(result, list) else [result]
    rows = [{k: v for k, v in msgspec.to_builtins(r).items() if k != "key"} for r in results]
    if not rows:
        print("(none)")
        return
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return msgspec.json.encode(value).decode() if value else "-"
    return str(value)
