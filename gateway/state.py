"""Everything the request handlers share, built once by the app factory."""

from __future__ import annotations

import sqlite3
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg
from litestar import Request

from auth.errors import AuthError
from gateway.config import Settings
from gateway.errors import (
    Forbidden,
    QuotaExceeded,
    RateLimited,
    SluiceError,
    Unauthorized,
    Unavailable,
)
from gateway.limits.model import LimiterUnavailable, Scope
from gateway.limits.model import RateLimited as LimitExceeded
from gateway.limits.tokens import reservation_tokens
from gateway.routing.pool import Router

if TYPE_CHECKING:
    from auth.service import AuthService, Principal
    from gateway.dialects.base import Parsed

TEAM_HEADERS = ("x-team-id", "x-friendli-team")
STORE_ERRORS = (OSError, sqlite3.Error, asyncpg.PostgresError, asyncpg.InterfaceError)


def request_id_of(request: Request) -> str:
    state = request.scope.setdefault("state", {})
    if "request_id" not in state:
        state["request_id"] = uuid.uuid4().hex
    return state["request_id"]


def auth_error(error: AuthError) -> SluiceError:
    if error.status == 401:
        return Unauthorized(error.message, code=error.code)
    if error.status == 429:
        headers = {"retry-after": str(max(1, round(error.retry_after or 1)))}
        return RateLimited(error.message, code=error.code, headers=headers)
    return Forbidden(error.message, code=error.code)


@dataclass
class AppState:
    settings: Settings
    router: Router
    auth: AuthService
    limiter: Any = None
    ledger: Any = None
    started_at: float = 0.0
    extras: dict = field(default_factory=dict)

    async def authenticate(self, request: Request) -> Principal:
        team = next((request.headers[h] for h in TEAM_HEADERS if request.headers.get(h)), None)
        client = request.client.host if request.client else "unknown"
        try:
            return await self.auth.authenticate(request.headers.get("authorization"), team, client)
        except AuthError as error:
            raise auth_error(error) from error
        except STORE_ERRORS as error:  # the key store is unreachable
            raise Unavailable("authentication is temporarily unavailable; retry shortly",
                              code="auth_unavailable") from error

    async def admit(self, principal: Principal, parsed: Parsed):
        """Reserve against every limit of the key and the team, or raise the 429 (503 when fail-closed)."""
        try:
            return await self.limiter.admit(self.scopes(principal), self.reservation(parsed))
        except LimitExceeded as refusal:
            kind = QuotaExceeded if refusal.kind == "budget" else RateLimited
            raise kind(refusal.message, headers=refusal.headers) from refusal
        except LimiterUnavailable as exc:
            raise Unavailable("rate limiting is unavailable; retry shortly", code="limiter_unavailable") from exc

    def scopes(self, principal: Principal) -> list[Scope]:
        scopes = []
        for prefix, owner, limits in (("key", principal.key_id, principal.key_limits),
                                      ("team", principal.team_id, principal.team_limits)):
            if limits is not None:
                scopes.append(Scope(id=f"{prefix}:{owner}", rpm=limits.rpm, tpm=limits.tpm,
                                    max_concurrency=limits.max_concurrency,
                                    monthly_token_budget=limits.monthly_token_budget))
        return scopes

    def reservation(self, parsed: Parsed) -> int:
        """Tokens to reserve: a prompt upper bound plus every candidate's maximum new tokens."""
        pool = self.router.pool(parsed.model)
        info = pool.info() if pool else None
        context = info.max_context if info else 4096
        total = 0
        for request in parsed.requests:
            if request.prompt_ids is not None:
                prompt = len(request.prompt_ids)
            else:  # a token is at least one UTF-8 byte, plus a few special tokens
                text = request.prompt or "".join(str(m.get("content", "")) for m in request.messages or [])
                prompt = len(text.encode()) + 16
            prompt = min(prompt, context)
            params = request.params
            new = params.max_tokens if params.max_tokens is not None else context - prompt
            if params.max_total_tokens is not None:
                new = params.max_total_tokens - prompt
            total += reservation_tokens(prompt, max(new, 0), n=params.n, best_of=params.best_of,
                                        num_beams=params.num_beams)
        return total
