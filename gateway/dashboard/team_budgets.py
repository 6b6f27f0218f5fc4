"""The Limits page's budgets form: the team's owners set and raise the team's budget in money and its monthly
token budget within the operator's ceiling, through the same operation as `PUT /v1/team/budgets`
(auth/team_budgets.py). A member gets 403; a bad or refused field is said at the field, the form as typed."""

from __future__ import annotations

from urllib.parse import urlencode

from litestar import Request, Response, post
from litestar.response import Redirect

from auth.errors import RequestError
from auth.models import Limits, TeamBudgets
from auth.service import AuthService
from auth.sessions import SessionStore
from common.errors import BadRequest
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.access import BASE
from gateway.dashboard.budget_fields import FIELD_OF_PARAM, SPEND_FIELDS, check_destinations, read_spend
from gateway.dashboard.fields import ascii_whole
from gateway.dashboard.filters import zone_or_utc
from gateway.dashboard.key_grants import MAX_LIMIT
from gateway.dashboard.keys import _actor, _owner_form
from gateway.dashboard.limits import limits_template
from gateway.serving.services import Services

TOKENS = "monthly_token_budget"


@post("/limits/budgets", opt=PUBLIC, status_code=303)
async def set_budgets(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    typed = {name: str(form.get(name, "")) for name in (*SPEND_FIELDS, TOKENS)}
    errors: dict[str, str] = {}
    spend = read_spend(typed, errors)
    tokens = None
    if typed[TOKENS].strip():
        tokens = ascii_whole(typed[TOKENS].strip())
        if tokens is None or tokens > MAX_LIMIT:
            errors[TOKENS] = f"A whole number from 0 to {MAX_LIMIT:,} in the digits 0-9, or empty for none."
    if not errors:
        try:
            await check_destinations(request, Limits(spend_budget=spend), operator=scope.is_admin)
            await auth.team_budgets.set(_actor(request, session, auth), scope.manager, scope.team.id,
                                        TeamBudgets(spend_budget=spend, monthly_token_budget=tokens))
        except (RequestError, BadRequest) as exc:
            errors[FIELD_OF_PARAM.get(exc.param or "", exc.param or "ceiling")] = exc.message
            return await limits_template(scope, session, auth, services, values=typed, errors=errors,
                                         status=exc.status)
    if errors:
        return await limits_template(scope, session, auth, services, values=typed, errors=errors, status=400)
    tz = zone_or_utc(request.query_params)[0]
    return Redirect(f"{BASE}/limits?" + urlencode({"team_id": scope.team.id, **({"tz": tz} if tz != "UTC" else {})}),
                    status_code=303)


BUDGET_HANDLERS = [set_budgets]
