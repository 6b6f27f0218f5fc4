"""The Limits page: the team's rate limits and budgets (tokens and money), the spend so far in each budget's
period, the alert thresholds reached and when each resets. Every member of the team sees it (and a service
key of the team); the signed-in key's own limits are shown beside the team's. The same figures as
`GET /v1/team/limits` (gateway/serving/spending.py builds both); the overview's budget panel reads them
through `team_limits` too. Owners set the team's budgets here, within the operator's ceiling (team_budgets.py)."""

from __future__ import annotations

from litestar import Request, get
from litestar.response import Template

from auth.models import Limits
from auth.policy import shows_own_key_limits
from auth.service import AuthService
from auth.sessions import Session, SessionStore
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.access import signed_in_scope
from gateway.dashboard.budget_fields import spend_values
from gateway.dashboard.scope import DashboardScope
from gateway.serving.services import Services
from gateway.serving.spending import LimitsView, limits_view


async def team_limits(scope: DashboardScope, auth: AuthService, services: Services, *,
                      team_month_tokens: int | None = None) -> tuple[LimitsView, dict]:
    """The team on screen's limits and budgets with spend so far (and the signed-in key's own), and a name for
    each scope: what the Limits page and the overview's budget panel show. `team_month_tokens`: the team's
    budget tokens this month, when the caller counted them already (`limits_view`)."""
    team = await auth.directory.team(scope.team.id)
    scoped = [(f"team:{scope.team.id}", team.limits if team is not None else None)]
    if shows_own_key_limits(scope.is_admin) and not scope.is_account:  # an account has no key of its own
        scoped.append((f"key:{scope.key.id}", scope.key.limits))
    view = await limits_view(services.spending, scope.team.id, scoped, team_month_tokens=team_month_tokens)
    names = {f"team:{scope.team.id}": f"Team {scope.team.name}", f"key:{scope.key.id}": f"Your key {scope.key.name}"}
    return view, names


async def limits_template(scope: DashboardScope, session: Session, auth: AuthService, services: Services, *,
                          values: dict[str, str] | None = None, errors: dict[str, str] | None = None,
                          alert_values: dict[str, str] | None = None, status: int = 200) -> Template:
    """The page; for the team's owners (and the operator) with the form that sets the team's budgets within the
    operator's ceiling (team_budgets.py), filled with `values` as typed when a field was refused."""
    view, names = await team_limits(scope, auth, services)
    team = await auth.directory.team(scope.team.id)
    own = team.limits if team is not None and team.limits is not None else Limits()
    shown = values or {**spend_values(own.spend_budget), "monthly_token_budget": (
        "" if own.monthly_token_budget is None else str(own.monthly_token_budget))}
    health = own.health_alerts
    alerts_shown = alert_values or ({
        "error_rate_percent": str(health.error_rate_percent or ""), "latency_p95_ms": str(health.latency_p95_ms or ""),
        "window_s": str(health.window_s), "min_requests": str(health.min_requests),
        "alert_webhook": health.webhook_url or "", "alert_emails": ", ".join(health.emails)} if health else {
        "error_rate_percent": "", "latency_p95_ms": "", "window_s": "300", "min_requests": "20", "alert_webhook": "",
        "alert_emails": ""})
    return Template("limits.html.j2", status_code=status, context={
        "page": "limits", "session": session, "scope": scope, "view": None, "limits": view, "names": names,
        "sets_budgets": scope.manager.manages_keys, "ceiling": own.ceiling, "values": shown, "errors": errors or {},
        "alerts": alerts_shown})


@get("/limits", opt=PUBLIC)
async def limits_page(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Template:
    session, scope = await signed_in_scope(request, sessions, auth)
    return await limits_template(scope, session, auth, services)


LIMITS_HANDLERS = [limits_page]
