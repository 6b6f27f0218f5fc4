"""Records and HTTP bodies of the auth package (msgspec Structs at every boundary)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import UNSET, Meta, UnsetType

NonNegative = Annotated[int, Meta(ge=0)]
Name = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"\S")]
MAX_KEY_MODELS = 32  # a key's model allow-list, as an owner makes or edits it
Role = Literal["owner", "member"]
ROLES = ("owner", "member")


MAX_BUDGET_MICROS = 10**15  # a billion in money: larger is a typo, not a budget
Email = Annotated[str, Meta(min_length=3, max_length=254, pattern=r"^[^@\s<>,;]+@[^@\s<>,;]+\.[^@\s<>,;]+$")]


def _check_webhook(url: str | None) -> None:
    """The shape of an alert webhook (where it may point is gateway/serving/outbound.py's rule, at send)."""
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http") or not parts.hostname or parts.username or parts.password:
            raise ValueError("webhook_url must be an https:// URL with a host and no credentials")


class SpendBudget(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """A budget in money for a key or a team, per UTC calendar month or day (gateway/serving/spending.py).

    hard: refuse new requests once the period's spend reaches the amount (429 `insufficient_quota`); else
    alerts only. Alerts at 50, 80 and 100 % go, once per threshold per period, to `webhook_url` and to `emails`,
    where the gateway's rule allows (gateway/serving/outbound.py: public https hosts, allowed e-mail domains)."""

    amount_micros: Annotated[int, Meta(ge=1, le=MAX_BUDGET_MICROS)]
    period: Literal["month", "day"] = "month"
    hard: bool = True
    webhook_url: Annotated[str, Meta(max_length=2000)] | None = None
    emails: Annotated[list[Email], Meta(max_length=10)] = []

    def __post_init__(self) -> None:
        _check_webhook(self.webhook_url)


class HealthAlerts(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """A team's alerts on its requests' health (gateway/serving/health_alerts.py), set by its owners
    (`PUT /v1/team/alerts`): the share of requests that failed (`error_rate_percent`) or the 95th percentile of
    latency (`latency_p95_ms`) over the last `window_s` seconds, once at least `min_requests` ended there. Each
    fires once when it crosses above its threshold and again only after falling back below it; it goes to the
    webhook and e-mails as a budget's alerts do (gateway/serving/outbound.py's rule)."""

    error_rate_percent: Annotated[int, Meta(ge=1, le=100)] | None = None
    latency_p95_ms: Annotated[int, Meta(ge=1, le=3_600_000)] | None = None
    window_s: Annotated[int, Meta(ge=60, le=86_400)] = 300
    min_requests: Annotated[int, Meta(ge=1, le=100_000)] = 20
    webhook_url: Annotated[str, Meta(max_length=2000)] | None = None
    emails: Annotated[list[Email], Meta(max_length=10)] = []

    def __post_init__(self) -> None:
        _check_webhook(self.webhook_url)
        if self.error_rate_percent is None and self.latency_p95_ms is None:
            raise ValueError("set error_rate_percent, latency_p95_ms or both")


class Ceiling(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """The operator's ceiling on what a team's owners may give their team and its keys (auth/budget_rules.py):
    a budget in money of at most `spend_micros` (per its own period) and a monthly token budget of at most
    `monthly_tokens`; a field left out caps nothing. Only the operator sets it (`PATCH /admin/teams/{id}`), on a
    team; without one, owners cannot change their team's budgets."""

    spend_micros: Annotated[int, Meta(ge=1, le=MAX_BUDGET_MICROS)] | None = None
    monthly_tokens: NonNegative | None = None


class Limits(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Per-key or per-team limits, enforced by the gateway's limits package (the spend budget by
    gateway/serving/spending.py); None = unlimited. `ceiling`: a team's only (see Ceiling)."""

    rpm: NonNegative | None = None
    tpm: NonNegative | None = None
    max_concurrency: NonNegative | None = None
    monthly_token_budget: NonNegative | None = None
    spend_budget: SpendBudget | None = None
    ceiling: Ceiling | None = None
    health_alerts: HealthAlerts | None = None  # a team's only (HealthAlerts)


# --- stored records (times are UTC epoch seconds) ---

class UserRecord(msgspec.Struct, frozen=True):
    id: str
    name: str
    created_at: float


class SessionRecord(msgspec.Struct, frozen=True):
    """A signed-in dashboard session; the browser's cookie holds the id whose SHA-256 is `id_hash`. It belongs to
    a key (signed in with an API key) or to a user (signed in to their account), never both."""

    id_hash: str
    key_id: str | None
    is_admin: bool
    created_at: float
    seen_at: float
    user_id: str | None = None
    client: str = ""  # the address it signed in from, as the account page lists it
    agent: str = ""  # the browser's User-Agent, cut to MAX_AGENT


MAX_AGENT = 200


class AccountRecord(msgspec.Struct, frozen=True):
    """A user's sign-in: their e-mail address (lower case, unique) and password hash (None: none set yet)."""

    user_id: str
    email: str
    password_hash: str | None
    created_at: float


LinkPurpose = Literal["sign_in", "reset", "invite"]


class LinkRecord(msgspec.Struct, frozen=True):
    """A one-time e-mail link, stored by the SHA-256 of its token: used once, before `expires_at`."""

    purpose: str
    email: str
    team_id: str | None  # invite: the team joined, with `role`
    role: str | None
    created_by: str  # who asked: an actor id, or the e-mail address itself
    created_at: float
    expires_at: float


class TeamRecord(msgspec.Struct, frozen=True):
    id: str
    name: str
    limits: Limits | None
    created_at: float


class MemberRecord(msgspec.Struct, frozen=True):
    team_id: str
    user_id: str
    role: str
    created_at: float


class KeyRecord(msgspec.Struct, frozen=True):
    id: str
    secret_hash: str  # hex HMAC-SHA256(pepper, clear key)
    name: str
    user_id: str | None  # None: a service key of team_id
    team_id: str  # the default (or only, for service keys) team
    is_admin: bool
    models: tuple[str, ...]
    limits: Limits | None
    expires_at: float | None
    revoked_at: float | None
    created_at: float
    last_used_at: float | None = None
    replaced_by: str | None = None

    def is_live(self, at: float) -> bool:
        """Neither revoked nor expired at `at`: the key may still sign in and be acted on."""
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > at)


class AuditRecord(msgspec.Struct, frozen=True):
    id: str
    at: float
    actor: str  # key id of the admin, or "cli:<os user>"
    source: str  # client address, or "cli"
    action: str  # e.g. "keys.create"
    target: str  # id of the thing acted on
    detail: dict[str, Any] = {}  # never holds a secret


# --- admin request bodies ---

class CreateUser(msgspec.Struct, forbid_unknown_fields=True):
    name: Name


class CreateTeam(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    limits: Limits | None = None


class PatchTeam(msgspec.Struct, forbid_unknown_fields=True):
    name: Name | UnsetType = UNSET
    limits: Limits | None | UnsetType = UNSET  # null clears the limits


class PutMember(msgspec.Struct, forbid_unknown_fields=True):
    role: Role


class CreateKey(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    team_id: str | None = None
    user_id: str | None = None
    models: list[Annotated[str, Meta(min_length=1, max_length=200)]] = []
    expires_at: str | None = None  # ISO 8601; naive means UTC
    limits: Limits | None = None
    is_admin: bool = False


class CreateTeamKey(msgspec.Struct, forbid_unknown_fields=True):
    """A key an owner creates for their own team: a service key; never a personal key (auth/policy.py), an
    admin key or another team's."""

    name: Name
    user_id: str | None = None  # refused with a 403 that says why (auth/policy.py), rather than "unknown field"
    # bounded as EditKey's: what an owner makes us store is bounded (revoked keys stay on record)
    models: Annotated[list[Annotated[str, Meta(min_length=1, max_length=200)]], Meta(max_length=MAX_KEY_MODELS)] = []
    expires_at: str | None = None
    limits: Limits | None = None  # the team's limits apply as well: a key's limits only narrow them


ModelName = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^\S+$")]


class EditKey(msgspec.Struct, forbid_unknown_fields=True):
    """`PATCH /v1/team/keys/{id}` (and the dashboard's edit form): a key's name, model allow-list (empty: every
    model) and limits (null: the team's only); a field left out stays as it is. auth/policy.py bounds who may
    change what, and to how much."""

    name: Name | UnsetType = UNSET
    models: Annotated[list[ModelName], Meta(max_length=MAX_KEY_MODELS)] | UnsetType = UNSET
    limits: Limits | None | UnsetType = UNSET


class TeamBudgets(msgspec.Struct, forbid_unknown_fields=True):
    """`PUT /v1/team/budgets` (and the Limits page's form): the team's own budgets as its owners set them, within
    the operator's ceiling (auth/budget_rules.py). null: no budget of that kind (refused where a ceiling caps it)."""

    spend_budget: SpendBudget | None = None
    monthly_token_budget: NonNegative | None = None


class BlockKey(msgspec.Struct, forbid_unknown_fields=True):
    """`POST /v1/team/keys/{id}/block`: the body may be left out."""

    reason: Annotated[str, Meta(max_length=200)] | None = None  # kept in the audit entry


class RotateKey(msgspec.Struct, forbid_unknown_fields=True):
    grace_seconds: Annotated[int, Meta(ge=0, le=30 * 86400)] = 0


# --- admin responses (times as ISO 8601 UTC strings) ---

class UserOut(msgspec.Struct):
    id: str
    name: str
    created_at: str


class TeamOut(msgspec.Struct):
    id: str
    name: str
    limits: Limits | None
    created_at: str


class MemberOut(msgspec.Struct):
    team_id: str
    user_id: str
    role: str
    created_at: str


class KeyOut(msgspec.Struct):
    id: str
    prefix: str  # the public part of the key, safe to display
    name: str
    user_id: str | None
    team_id: str
    is_admin: bool
    models: list[str]
    limits: Limits | None
    expires_at: str | None
    revoked_at: str | None
    created_at: str
    last_used_at: str | None
    replaced_by: str | None


class TeamKeyOut(KeyOut):
    """A key as the owners of a team see it (`GET /v1/team/keys`, auth/views.py `team_key_out`)."""

    # None: a member's personal key made in another team (whose details are not shown); the base's is never None
    team_id: str | None  # type: ignore[assignment]
    blocked: bool = False  # blocked in this team by its owners: it cannot act here (its other teams unaffected)
    made_here: bool = True  # False: made in another team; team_id, models, limits and last_used_at are hidden


class KeyCreated(KeyOut):
    key: str = ""  # the clear key, shown once
    replaces: str | None = None  # rotation: the old key id, valid until its expires_at


class AuditOut(msgspec.Struct):
    id: str
    at: str
    actor: str
    source: str
    action: str
    target: str
    detail: dict[str, Any]
