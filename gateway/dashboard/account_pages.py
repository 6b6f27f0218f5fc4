"""People's own way in (auth/accounts.py): e-mail and password, a one-time sign-in link, a password reset link,
an invitation to a team (auth/memberships.py); and the account page, which lists the user's sessions and ends
any of them or all ("sign out everywhere").

A link in an e-mail opens a page that asks to confirm (a button that posts the token), never signs in or sets
anything on GET: mail scanners fetch links, and a GET that used the token would spend it. Every sign-in starts a
new session id (no fixation). Errors are said on the page they came from, with their status."""

from __future__ import annotations

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from auth.accounts import LINK_TTL_S, RESET_TTL_S, normal_email
from auth.errors import AuthError, RequestError
from auth.service import AuthService
from auth.sessions import Session, SessionStore, digest
from gateway.authentication.headers import client_address
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard import account_mail
from gateway.dashboard.access import (
    BASE,
    NotSignedIn,
    cookie,
    current_session,
    masked_token,
    posted_form,
    session_form,
    signed_in,
)
from gateway.dashboard.render import when
from gateway.dashboard.sign_in_page import login_page, next_page_of
from gateway.serving.services import Services

SENT = "If an account has that address, an e-mail with a link is on its way. The link works once, for {} minutes."


def _client(request: Request, auth: AuthService) -> str:
    return client_address(request, auth.clients)


async def _start(request: Request, sessions: SessionStore, auth: AuthService, old: Session | None, user_id: str,
                 landing: str) -> Response:
    """A new session of the account (the old one, if any, ends), and on to `landing`."""
    if old is not None and old.signed_in:
        await sessions.end(old.id)
    signed = await sessions.start(user_id=user_id, client=_client(request, auth),
                                  agent=request.headers.get("user-agent", ""))
    return Redirect(landing, status_code=303, cookies=[cookie(request, signed)])


def _page(request: Request, session: Session, template: str, status: int = 200, **context) -> Template:
    return Template(f"{template}.html.j2", status_code=status, cookies=[cookie(request, session)],
                    context={"csrf": masked_token(session), "session": None, "page": "", **context})


def sign_in_landing(next_page: str | None) -> str:
    return next_page or f"{BASE}/overview"


@post("/sign-in", opt=PUBLIC, status_code=303)
async def password_sign_in(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, form = await session_form(request, sessions)
    next_page = next_page_of(form.get("next"))
    password = form.get("password") if isinstance(form.get("password"), str) else ""
    try:
        email = normal_email(form.get("email"))
        if not password:
            raise RequestError(400, "missing_password", "Enter your password.", "password")
        user_id = await auth.accounts.sign_in(email, password, _client(request, auth))
    except (AuthError, RequestError) as exc:
        return login_page(request, session, exc.message, exc.status, next_page, email=form.get("email"))
    return await _start(request, sessions, auth, session, user_id, sign_in_landing(next_page))


async def _mail_link(request: Request, sessions: SessionStore, auth: AuthService, services: Services,
                     purpose: str) -> tuple[Session, str | None, int, object]:
    """Asks for a sign-in or reset link: (session, the message to show, its status, the address as typed)."""
    session, form = await session_form(request, sessions)
    try:
        email = normal_email(form.get("email"))
        token = await auth.accounts.request_link(purpose, email, _client(request, auth))
    except (AuthError, RequestError) as exc:
        return session, exc.message, exc.status, form.get("email")
    settings = services.settings
    if token is not None and purpose == "sign_in":
        url = account_mail.link(settings, "sign-in/link", token)
        account_mail.send(settings, purpose, email, "Your Sluice sign-in link",
                          account_mail.sign_in_text(url, int(LINK_TTL_S // 60)))
    elif token is not None:
        url = account_mail.link(settings, "reset", token)
        account_mail.send(settings, purpose, email, "Set a new Sluice password",
                          account_mail.reset_text(url, int(RESET_TTL_S // 60)))
    minutes = LINK_TTL_S if purpose == "sign_in" else RESET_TTL_S
    return session, SENT.format(int(minutes // 60)), 200, form.get("email")


@post("/sign-in/email-link", opt=PUBLIC)
async def ask_sign_in_link(request: Request, sessions: SessionStore, auth: AuthService,
                           services: Services) -> Response:
    session, message, status, email = await _mail_link(request, sessions, auth, services, "sign_in")
    return login_page(request, session, message, status, None, email=email, notice=status == 200)


@get("/sign-in/link", opt=PUBLIC)
async def sign_in_link_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _link_page(request, sessions, auth, "sign_in", "link_sign_in")


async def _link_page(request: Request, sessions: SessionStore, auth: AuthService, purpose: str, template: str,
                     **context: object) -> Response:
    """The page an e-mailed link opens: its confirmation form while the link is good (opening it spends
    nothing), else a 400 saying it is gone."""
    session = await current_session(request, sessions) or sessions.anonymous()
    token = request.query_params.get("token")
    link = await auth.accounts.peek(purpose, token)
    return _page(request, session, template, 200 if link else 400, token=token if link else "",
                 email=link.email if link else "", **context)


@post("/sign-in/link", opt=PUBLIC, status_code=303)
async def use_sign_in_link(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, form = await session_form(request, sessions)
    try:
        user_id = await auth.accounts.use_sign_in_link(form.get("token"))
    except RequestError:
        return _page(request, session, "link_sign_in", 400, token="", email="")
    return await _start(request, sessions, auth, session, user_id, f"{BASE}/overview")


@get("/forgot", opt=PUBLIC)
async def forgot_page(request: Request, sessions: SessionStore) -> Response:
    session = await current_session(request, sessions) or sessions.anonymous()
    return _page(request, session, "forgot", message=None, email="")


@post("/forgot", opt=PUBLIC)
async def ask_reset_link(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Response:
    session, message, status, email = await _mail_link(request, sessions, auth, services, "reset")
    return _page(request, session, "forgot", status, message=message, email=email if status != 200 else "",
                 sent=status == 200)


@get("/reset", opt=PUBLIC)
async def reset_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _link_page(request, sessions, auth, "reset", "reset", message=None)


@post("/reset", opt=PUBLIC, status_code=303)
async def reset_password(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, form = await session_form(request, sessions)
    token = form.get("token")
    if form.get("password") != form.get("confirm"):
        link = await auth.accounts.peek("reset", token)
        return _page(request, session, "reset", 400, token=token if link else "", email=link.email if link else "",
                     message="The two passwords differ.")
    try:
        user_id = await auth.accounts.reset_password(token, form.get("password"))
    except RequestError as exc:
        link = await auth.accounts.peek("reset", token)
        return _page(request, session, "reset", exc.status, token=token if link else "",
                     email=link.email if link else "", message=exc.message)
    return await _start(request, sessions, auth, session, user_id, f"{BASE}/overview")


@get("/invite", opt=PUBLIC)
async def invite_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session = await current_session(request, sessions) or sessions.anonymous()
    return await _invite_page(request, session, auth, request.query_params.get("token"))


async def _invite_page(request: Request, session: Session, auth: AuthService, token: object,
                       message: str | None = None, status: int = 200, name: object = "") -> Template:
    link = await auth.memberships.peek(token)
    if link is None or link.team_id is None:
        return _page(request, session, "invite", 400, link=None, token="", message=None)
    team = await auth.directory.team(link.team_id)
    account = await auth.store.account_by_email(link.email)
    return _page(request, session, "invite", status, link=link, token=token, team=team.name if team else "",
                 new_account=account is None, needs_password=account is None or account.password_hash is None,
                 message=message, name=name if isinstance(name, str) else "")


@post("/invite", opt=PUBLIC, status_code=303)
async def accept_invite(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, form = await session_form(request, sessions)
    token = form.get("token")
    if "password" in form and form.get("password") != form.get("confirm"):
        return await _invite_page(request, session, auth, token, "The two passwords differ.", 400, form.get("name"))
    try:
        user_id, team_id = await auth.memberships.accept(token, form.get("name"), form.get("password"),
                                                         f"dashboard:{_client(request, auth)}")
    except RequestError as exc:
        return await _invite_page(request, session, auth, token, exc.message, exc.status, form.get("name"))
    return await _start(request, sessions, auth, session, user_id, f"{BASE}/overview?team_id={team_id}")


async def _account_session(request: Request, sessions: SessionStore, auth: AuthService) -> Session:
    found = await signed_in(request, sessions, auth)
    if found is None:
        raise NotSignedIn
    session, _ = found
    if session.user_id is None:
        raise RequestError(404, "no_account", "Signed in with an API key: there is no account to show. Sign in "
                           "with your e-mail address to see your sessions.")
    return session


@get("/account", opt=PUBLIC)
async def account_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session = await _account_session(request, sessions, auth)
    assert session.user_id is not None
    account = await auth.accounts.account_of(session.user_id)
    rows = await sessions.of_user(session.user_id)
    return Template("account.html.j2", context={
        "session": session, "csrf": masked_token(session), "page": "account", "email": account.email if account else "",
        "rows": rows, "current": digest(session.id), "when": when})


@post("/account/sessions/end", opt=PUBLIC, status_code=303)
async def end_session(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session = await _account_session(request, sessions, auth)
    form = await posted_form(request, session)
    assert session.user_id is not None
    target = form.get("session")
    if not isinstance(target, str) or not await sessions.end_user_session(session.user_id, target[:64]):
        raise RequestError(404, "session_not_found", "No such session of yours (it may have ended already).")
    if target == digest(session.id):
        return Redirect(f"{BASE}/login", status_code=303, cookies=[cookie(request, None)])
    return Redirect(f"{BASE}/account", status_code=303)


@post("/account/sign-out-everywhere", opt=PUBLIC, status_code=303)
async def sign_out_everywhere(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session = await _account_session(request, sessions, auth)
    await posted_form(request, session)
    assert session.user_id is not None
    await sessions.end_user(session.user_id)
    return Redirect(f"{BASE}/login", status_code=303, cookies=[cookie(request, None)])


ACCOUNT_HANDLERS = [password_sign_in, ask_sign_in_link, sign_in_link_page, use_sign_in_link, forgot_page,
                    ask_reset_link, reset_page, reset_password, invite_page, accept_invite, account_page,
                    end_session, sign_out_everywhere]
