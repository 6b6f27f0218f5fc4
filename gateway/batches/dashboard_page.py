"""The dashboard's Batches page: a team's batches (both APIs), newest first, with their status, progress, counts,
tokens, spend (cost, what the batch rate and the prefix cache saved, summed from the ledger's records of the
team's lines: billing/insights/batch_spend.py), and links to each OpenAI batch's output and error files
(downloaded through the dashboard's session, from the team on screen only). For the team's owners and members; a
service key's session, the admin's and another team's get 403 (a team the key cannot reach: 404, as every
dashboard page)."""

from __future__ import annotations

from typing import cast

from litestar import Request, Router, get
from litestar.di import Provide
from litestar.response import Stream, Template

from auth.policy import reads_batches
from auth.service import AuthService
from auth.sessions import SessionStore
from billing.insights.batch_spend import BatchSpend, batch_spend
from billing.ledger import Ledger
from common.errors import SluiceError
from gateway.authentication.middleware import PUBLIC, auth_service
from gateway.batches.service import BatchService
from gateway.dashboard.access import BASE, Forbidden, NotSignedIn, signed_in_scope
from gateway.dashboard.compression import gzipped
from gateway.dashboard.headers import page_headers
from gateway.dashboard.render import when
from gateway.dashboard.routes import _error_page, _sessions, _sign_in_first
from gateway.errors import NotFound

SHOWN = 200  # batches the page lists


async def _team_scope(request: Request, sessions: SessionStore, auth: AuthService):
    session, scope = await signed_in_scope(request, sessions, auth)
    if not reads_batches(scope.team.role):
        raise Forbidden("The Batches page is for the team's owners and members.")
    return session, scope


@get("/batches", opt=PUBLIC)
async def batches_page(request: Request, sessions: SessionStore, auth: AuthService, batches: BatchService,
                       ledger: Ledger | None) -> Template:
    session, scope = await _team_scope(request, sessions, auth)
    rows = []
    shown = await batches.store.all_of_team(scope.team.id, SHOWN)
    spend: dict[str, BatchSpend] = {}
    if shown and ledger is not None:  # the team's records since its oldest batch shown, summed per batch
        since = min(cast(float, batch.times["created_at"]) for batch in shown)
        spend = await batch_spend(ledger.store, scope.team.id, [batch.id for batch in shown], since)
    for batch in shown:
        counts = await batches.store.counts(batch.id)
        ended = counts.succeeded + counts.errored + counts.cancelled + counts.expired
        rows.append({"batch": batch, "counts": counts, "done": ended, "total": batch.total,
                     "percent": int(100 * ended / batch.total) if batch.total else 100,
                     "spend": spend.get(batch.id, BatchSpend()),
                     "created": when(cast(float, batch.times["created_at"]), "UTC")})  # set on insert
    return Template("batches.html.j2", context={"session": session, "scope": scope, "page": "batches",
                                                "rows": rows, "shown": SHOWN})


@get("/batches/files/{file_id:str}", opt=PUBLIC)
async def batch_file(request: Request, sessions: SessionStore, auth: AuthService, batches: BatchService,
                     file_id: str) -> Stream:
    _, scope = await _team_scope(request, sessions, auth)
    row = await batches.files.get(scope.team.id, file_id[:128])
    if row is None:
        raise NotFound("No such file in this team.")
    return Stream(batches.files.chunks(row[0]), media_type="application/jsonl",
                  headers={"content-disposition": f'attachment; filename="{row[0]}.jsonl"'})


def dashboard_batches_router() -> Router:
    return Router(path=BASE, route_handlers=[batches_page, batch_file],
                  dependencies={"sessions": Provide(_sessions, sync_to_thread=False),
                                "auth": Provide(auth_service, sync_to_thread=False)},
                  exception_handlers={SluiceError: _error_page, NotSignedIn: _sign_in_first},
                  middleware=[page_headers, gzipped])
