"""The key edit form of the keys page: rename a key, set its limits and model allow-list, through the same
operation as `PATCH /v1/team/keys/{id}` (auth/team_keys.py `edit`, under auth/policy.py): an owner edits the
team's service keys and renames their own personal key, never above the team's own limits; a member gets 403,
another team's key 404, as from the API. Every field is read strictly and bounded here, and a refusal is shown
at its field (400, or the rule's 403) with the values as typed, never as a bare error."""

from __future__ import annotations

import re

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from auth.errors import RequestError
from auth.keys import display_prefix
from auth.models import MAX_KEY_MODELS, EditKey, KeyRecord, Limits
from auth.policy import LIMIT_FIELDS
from auth.service import AuthService
from auth.sessions import Session, SessionStore
from common.errors import BadRequest
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.fields import ascii_whole
from gateway.dashboard.keys import _acting_team, _actor, _keys_url, _owner_form, _owner_scope
from gateway.dashboard.scope import DashboardScope

MAX_NAME = 200
MAX_MODEL = 200
MAX_LIMIT = 10**12  # far above any real rate or budget; the team's own limit is the real cap
MODEL_SPLIT = re.compile(r"[\s,]+")
MODEL_NAME = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces, as model names are written


class FieldErrors(Exception):
    def __init__(self, errors: dict[str, str], status: int = 400) -> None:
        super().__init__(errors)
        self.errors = errors
        self.status = status


def _form_values(key: KeyRecord) -> dict[str, str]:
    limits = msgspec.structs.asdict(key.limits) if key.limits is not None else {}
    return {"name": key.name, "models": "\n".join(key.models),
            **{name: "" if limits.get(name) is None else str(limits[name]) for name in LIMIT_FIELDS}}


def read_edit(form: dict) -> tuple[EditKey, dict[str, str]]:
    """The posted fields as an EditKey, and as typed (to show again); FieldErrors naming each bad field. The
    models and limits fields are read only when the form has them (a personal key's form has only its name)."""
    typed = {name: value for name in ("name", "models", *LIMIT_FIELDS)
             if isinstance(value := form.get(name), str)}
    errors: dict[str, str] = {}
    name = typed.get("name", "").strip()
    if not name:
        errors["name"] = "Enter a name."
    elif len(name) > MAX_NAME or not name.isprintable():
        errors["name"] = f"A name has at most {MAX_NAME} printable characters."
    models = [m for m in MODEL_SPLIT.split(typed.get("models", "")) if m]
    if len(models) > MAX_KEY_MODELS:
        errors["models"] = f"At most {MAX_KEY_MODELS} models."
    elif any(len(m) > MAX_MODEL or not MODEL_NAME.fullmatch(m) for m in models):
        errors["models"] = f"Model names are printable ASCII without spaces, at most {MAX_MODEL} characters each."
    limits: dict[str, int] = {}
    for field in LIMIT_FIELDS:
        raw = typed.get(field, "").strip()
        if raw:
            value = ascii_whole(raw)
            if value is None or value > MAX_LIMIT:
                errors[field] = f"A whole number from 0 to {MAX_LIMIT:,} in the digits 0-9, or empty for none."
            else:
                limits[field] = value
    if errors:
        raise FieldErrors(errors)
    has_limits = any(field in typed for field in LIMIT_FIELDS)
    return EditKey(name=name, models=models if "models" in typed else msgspec.UNSET,
                   limits=(Limits(**limits) if limits else None) if has_limits else msgspec.UNSET), typed


async def _form(auth: AuthService, session: Session, scope: DashboardScope, key: KeyRecord, values: dict[str, str],
                errors: dict[str, str] | None = None, status: int = 200) -> Template:
    team = await auth.directory.team(key.team_id)
    return Template("key_edit.html.j2", status_code=status, context={
        "session": session, "scope": scope, "page": "keys", "key": key, "key_prefix": display_prefix(key.id),
        "values": values, "errors": errors or {}, "limit_fields": LIMIT_FIELDS,
        "form_fields": ("name", "models", *LIMIT_FIELDS), "grants": key.user_id is None or scope.is_admin,
        "team_limits": team.limits if team is not None and team.limits is not None else Limits()})


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
    try:
        body, _ = read_edit(form)
        await auth.team_keys.edit(_actor(request, session, auth), scope.manager, _acting_team(scope), key_id, body)
    except FieldErrors as refused:
        return await _form(auth, session, scope, key, typed, refused.errors, refused.status)
    except (RequestError, BadRequest) as exc:
        if exc.status not in (400, 403, 409):
            raise
        return await _form(auth, session, scope, key, typed, {exc.param or "name": exc.message}, exc.status)
    return Redirect(_keys_url(request, scope), status_code=303)


EDIT_HANDLERS = [edit_form, edit_key]
