"""The key edit form of the keys page: rename a key, set its limits and model allow-list, through the same
operation as `PATCH /v1/team/keys/{id}` (auth/team_keys.py `edit`, under auth/policy.py): an owner edits the
team's service keys and renames their own personal key, never above the team's own limits or its budgets
above the operator's ceiling (auth/budget_rules.py); a member gets 403,
another team's key 404, as from the API. Every field is read strictly and bounded here, and a refusal is shown
at its field (400, or the rule's 403) with the values as typed, never as a bare error."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from auth.errors import RequestError
from auth.keys import display_prefix
from auth.models import EditKey, KeyRecord, Limits
from auth.policy import LIMIT_FIELDS, sets_grants
from auth.service import AuthService
from auth.sessions import Session, SessionStore
from common.errors import BadRequest
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.budget_fields import FIELD_OF_PARAM, check_destinations, spend_values
from gateway.dashboard.key_grants import GRANT_FIELDS, read_grants
from gateway.dashboard.keys import _acting_team, _actor, _keys_url, _owner_form, _owner_scope
from gateway.dashboard.scope import DashboardScope

MAX_NAME = 200


class FieldErrors(Exception):
    def __init__(self, errors: dict[str, str], status: int = 400) -> None:
        super().__init__(errors)
        self.errors = errors
        self.status = status


def _form_values(key: KeyRecord) -> dict[str, str]:
    limits = msgspec.structs.asdict(key.limits) if key.limits is not None else {}
    return {"name": key.name, "models": "\n".join(key.models),
            **{name: "" if limits.get(name) is None else str(limits[name]) for name in LIMIT_FIELDS},
            **spend_values(key.limits.spend_budget if key.limits is not None else None)}


def read_edit(form: dict) -> tuple[EditKey, dict[str, str]]:
    """The posted fields as an EditKey, and as typed (to show again); FieldErrors naming each bad field. The
    models and limits fields are read only when the form has them (a personal key's form has only its name)."""
    typed = {name: value for name in ("name", *GRANT_FIELDS) if isinstance(value := form.get(name), str)}
    errors: dict[str, str] = {}
    name = typed.get("name", "").strip()
    if not name:
        errors["name"] = "Enter a name."
    elif len(name) > MAX_NAME or not name.isprintable():
        errors["name"] = f"A name has at most {MAX_NAME} printable characters."
    models, limits = read_grants(typed, errors)
    if errors:
        raise FieldErrors(errors)
    has_limits = any(field in typed for field in LIMIT_FIELDS)
    return EditKey(name=name, models=models if "models" in typed else msgspec.UNSET,
                   limits=limits if has_limits else msgspec.UNSET), typed


async def _form(auth: AuthService, session: Session, scope: DashboardScope, key: KeyRecord, values: dict[str, str],
                errors: dict[str, str] | None = None, status: int = 200) -> Template:
    team = await auth.directory.team(key.team_id)
    team_limits = team.limits if team is not None and team.limits is not None else Limits()
    return Template("key_edit.html.j2", status_code=status, context={
        "session": session, "scope": scope, "page": "keys", "key": key, "key_prefix": display_prefix(key.id),
        "values": values, "errors": errors or {}, "limit_fields": LIMIT_FIELDS,
        "form_fields": ("name", *GRANT_FIELDS),
        "grants": sets_grants(scope.is_admin, key.user_id), "team_limits": team_limits, "ceiling": team_limits.ceiling})


@get("/keys/{key_id:str}/edit", opt=PUBLIC)
async def edit_form(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope = await _owner_scope(request, sessions, auth)
    key = await auth.team_keys.may(scope.manager, _acting_team(scope), key_id, "edit")
    return await _form(auth, session, scope, key, _form_values(key))


@post("/keys/{key_id:str}/edit", opt=PUBLIC, status_code=303)
async def edit_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    key = await auth.team_keys.may(scope.manager, _acting_team(scope), key_id, "edit")  # 404 / 403 first
    typed = {**_form_values(key), **{k: v for k, v in form.items() if isinstance(v, str)}}
    if "spend_amount" in form:
        typed["spend_hard"] = str(form.get("spend_hard", ""))  # an unchecked box is not posted
    try:
        body, _ = read_edit(form)
        if body.limits is not msgspec.UNSET:
            await check_destinations(request, body.limits, operator=scope.is_admin)
        await auth.team_keys.edit(_actor(request, session, auth), scope.manager, _acting_team(scope), key_id, body)
    except FieldErrors as refused:
        return await _form(auth, session, scope, key, typed, refused.errors, refused.status)
    except (RequestError, BadRequest) as exc:
        if exc.status not in (400, 403, 409):
            raise
        field = FIELD_OF_PARAM.get(exc.param or "name", exc.param or "name")
        return await _form(auth, session, scope, key, typed, {field: exc.message}, exc.status)
    return Redirect(_keys_url(request, scope), status_code=303)


EDIT_HANDLERS = [edit_form, edit_key]
