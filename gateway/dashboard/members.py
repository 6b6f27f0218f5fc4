"""The Members page of a team: its members (roles, since when) and pending invitations; its owners (and the
operator) invite by e-mail, change roles, remove members and withdraw invitations (auth/memberships.py).

Every form acts in the team on screen (`?team_id=`, resolved as every page resolves it: a team the signed-in
person does not reach is a 404) and names members and invitations of that team only; the store's statements
carry the team too, so nothing of another team can be reached by editing a form. A refusal is said on the page,
with its status."""

from __future__ import annotations

from urllib.parse import urlencode

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from auth.accounts import normal_email
from auth.admin import Actor
from auth.clock import parse_iso
from auth.errors import AuthError, RequestError
from auth.memberships import INVITE_TTL_S, MAX_PENDING_INVITES
from auth.models import ROLES
from auth.policy import is_owner
from auth.service import AuthService
from auth.sessions import Session, SessionStore
from gateway.authentication.headers import client_address
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard import account_mail
from gateway.dashboard.access import BASE
from gateway.dashboard.filters import zone_or_utc
from gateway.dashboard.keys import _owner_form, _owner_scope
from gateway.dashboard.render import when
from gateway.dashboard.scope import DashboardScope
from gateway.serving.services import Services

DONE = {"invited": "Invitation sent.", "role": "Role changed.", "removed": "Member removed.",
        "withdrawn": "Invitation withdrawn."}  # what the page says after a redirect: fixed words, never the URL's


def _local(at: float | str, tz: str) -> str:
    """A time as every dashboard table writes it, in the view's zone (an API time is ISO 8601, UTC)."""
    return when(parse_iso(at) if isinstance(at, str) else at, tz, seconds=True)


async def _render(request: Request, session: Session, scope: DashboardScope, auth: AuthService,
                  message: str | None = None, status: int = 200) -> Template:
    members = await auth.admin.list_members(scope.team.id)
    user_ids = [m.user_id for m in members]
    names = await auth.directory.names(user_ids=user_ids)
    emails = await auth.store.emails_of(user_ids)
    tz, tz_problem = zone_or_utc(request.query_params)
    pending = await auth.memberships.pending(scope.team.id)
    owners = sum(1 for m in members if is_owner(m.role))
    return Template("members.html.j2", status_code=400 if tz_problem and status == 200 else status, context={
        "session": session, "scope": scope, "page": "members", "members": members, "names": names, "emails": emails,
        "tz": tz, "tz_problem": tz_problem, "pending": pending, "roles": ROLES, "owners": owners, "message": message,
        "done": DONE.get(request.query_params.get("done") or ""), "local": _local, "max_pending": MAX_PENDING_INVITES})


@get("/members", opt=PUBLIC)
async def members_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, scope = await _owner_scope(request, sessions, auth)
    return await _render(request, session, scope, auth)


def _actor(request: Request, session: Session, auth: AuthService) -> Actor:
    assert session.key_id is not None
    return Actor(id=session.key_id, source=f"dashboard:{client_address(request, auth.clients)}")


def _back(scope: DashboardScope, done: str) -> Redirect:
    return Redirect(f"{BASE}/members?{urlencode({'team_id': scope.team.id, 'done': done})}", status_code=303)


@post("/members/invite", opt=PUBLIC, status_code=303)
async def invite(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    try:
        email = normal_email(form.get("email"))
        token = await auth.memberships.invite(_actor(request, session, auth), scope.manager, scope.team.id, email,
                                              form.get("role"))
    except (AuthError, RequestError) as exc:
        return await _render(request, session, scope, auth, exc.message, exc.status)
    role = str(form.get("role"))
    url = account_mail.link(services.settings, "invite", token)
    account_mail.send(services.settings, "invite", email, f"Join {scope.team.name} on Sluice",
                      account_mail.invite_text(url, scope.team.name, role, int(INVITE_TTL_S // 86400)))
    return _back(scope, "invited")


async def _act(request: Request, sessions: SessionStore, auth: AuthService, action: str) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    actor, user_id = _actor(request, session, auth), form.get("user_id")
    try:
        if action == "role":
            await auth.memberships.set_role(actor, scope.manager, scope.team.id, str(user_id or ""), form.get("role"))
            done = "role"
        elif action == "remove":
            await auth.memberships.remove(actor, scope.manager, scope.team.id, str(user_id or ""))
            done = "removed"
        else:
            await auth.memberships.withdraw(actor, scope.manager, scope.team.id, form.get("invite"))
            done = "withdrawn"
    except (AuthError, RequestError) as exc:
        return await _render(request, session, scope, auth, exc.message, exc.status)
    return _back(scope, done)


@post("/members/role", opt=PUBLIC, status_code=303)
async def change_role(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _act(request, sessions, auth, "role")


@post("/members/remove", opt=PUBLIC, status_code=303)
async def remove(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _act(request, sessions, auth, "remove")


@post("/members/withdraw", opt=PUBLIC, status_code=303)
async def withdraw(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _act(request, sessions, auth, "withdraw")


MEMBER_HANDLERS = [members_page, invite, change_role, remove, withdraw]
