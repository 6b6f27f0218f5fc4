"""Settings: embedded defaults, overridden by a TOML file, then by SLUICE_* environment variables (one per setting,
derived from these structs: gateway/environment.py), then by the command line's flags."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from auth.forwarded import parse_networks
from auth.models import Limits
from common import settings_env
from gateway import config_object, environment
from gateway.endpoints.queue_metric import CloudWatchSettings
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import EndpointSpec, LocalProvisioning, check_spelling, service_taken, sharing_service
from gateway.redis_iam import RedisIamError, RedisIamSettings, check_url

DEFAULT_TEAM_LIMITS = {"rpm": 1200, "tpm": 2_000_000, "max_concurrency": 64}  # documented in README.md
SECRETS = ("admin_key", "key_pepper", "metrics_token")  # settings shown as *** in the repr
LEASE_MARGIN_S = 60.0  # a timed-out request settles its slot well before the lease would reclaim it


class HttpSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[http]` table: what one connection may hold before the app sees its request
    (gateway/edge/http_limits.py)."""

    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 20)] = 32 * 1024  # request line + headers; 431
    header_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0  # a whole request head; 408
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0  # a whole body, from its head; 408
    # idle between requests; behind an ALB above its idle timeout (up to 4,000 s), which the Terraform renders
    keep_alive_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=4200)] = 5.0
    # open connections per client (an IPv6 client is its /64); behind trusted_proxies, requests in progress per
    # client their X-Forwarded-For names; 0 = no cap; 429 too_many_connections
    max_connections_per_client: Annotated[int, msgspec.Meta(ge=0)] = 256
    # bytes of request bodies begun and not ended, held by this process in all and per client (past the total, the
    # largest holder of the largest client is cut; past a client's share, its connection that went over): 429
    max_buffered_body_bytes: Annotated[int, msgspec.Meta(ge=1 << 16)] = 64 << 20
    max_buffered_body_bytes_per_client: Annotated[int, msgspec.Meta(ge=1 << 16)] = 16 << 20


class BudgetAlertSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[budget_alerts]` table: where alerts of spend budgets go (gateway/serving/budget_alerts.py).

    A webhook body is signed with HMAC-SHA256 under `webhook_secret` (header `x-sluice-signature:
    sha256=<hex>`); e-mail goes through the SMTP server named here (none: e-mail alerts are skipped and logged).
    """

    webhook_secret: Annotated[str, msgspec.Meta(max_length=512)] = ""
    allow_http_webhooks: bool = False  # plain http:// webhook URLs (tests, a private network); else https only
    # where webhooks may go (gateway/serving/outbound.py): [] = any host whose addresses are all public; else only
    # these hosts ("hooks.example.com", or ".example.com" for its subdomains)
    webhook_hosts: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=253)]],
                             msgspec.Meta(max_length=1000)] = []
    # private networks (CIDRs) a webhook may reach besides public addresses (an internal relay; tests); [] = none
    webhook_networks: Annotated[list[str], msgspec.Meta(max_length=1000)] = []
    # the domains a team's owner may send alert e-mails to (a domain covers its subdomains); [] = owners set no
    # e-mail addresses (the operator's budgets, set through /admin, may name any)
    email_domains: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=253)]],
                             msgspec.Meta(max_length=1000)] = []
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0  # one webhook call or SMTP session
    attempts: Annotated[int, msgspec.Meta(ge=1, le=5)] = 3  # per alert and destination, with backoff
    smtp_host: Annotated[str, msgspec.Meta(max_length=255)] = ""
    smtp_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 587
    smtp_starttls: bool = True  # STARTTLS before signing in (off only for a local relay)
    smtp_username: Annotated[str, msgspec.Meta(max_length=255)] = ""
    smtp_password: Annotated[str, msgspec.Meta(max_length=512)] = ""
    smtp_from: Annotated[str, msgspec.Meta(max_length=254)] = "sluice@localhost"

    def __post_init__(self) -> None:
        parse_networks(self.webhook_networks)  # a malformed CIDR is named at start

    def __repr__(self) -> str:  # the secrets never reach a log line
        shown = {f: "***" if f in ("webhook_secret", "smtp_password") and getattr(self, f) else getattr(self, f)
                 for f in self.__struct_fields__}
        return f"BudgetAlertSettings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


class OidcSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[oidc]` table: sign-in to the dashboard through the operator's identity provider (OpenID Connect,
    authorization code with PKCE: gateway/dashboard/oidc.py). Off while `issuer` is "". A person signs in to the
    account whose e-mail address the provider vouches for (`email_verified`); the provider creates no accounts."""

    issuer: Annotated[str, msgspec.Meta(max_length=500, pattern=r"^(https?://\S+)?$")] = ""
    client_id: Annotated[str, msgspec.Meta(max_length=500)] = ""
    client_secret: Annotated[str, msgspec.Meta(max_length=500)] = ""
    allow_http: bool = False  # an http:// issuer (tests, a provider on loopback); else https only
    label: Annotated[str, msgspec.Meta(max_length=100)] = "your identity provider"  # "Sign in with <label>"

    def __post_init__(self) -> None:
        if self.issuer.startswith("http://") and not self.allow_http:
            raise ValueError("oidc.issuer must be an https:// URL (allow_http = true for a provider on loopback)")
        if self.issuer and not self.client_id:
            raise ValueError("oidc.client_id is needed once oidc.issuer is set")

    def __repr__(self) -> str:  # the client secret never reaches a log line
        return f"OidcSettings(issuer={self.issuer!r}, client_id={self.client_id!r}, client_secret=***)"


class ResponsesSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[responses]` table: what the Responses API keeps of a `store: true` response, per team
    (gateway/dialects/responses/store.py)."""

    retention_s: Annotated[float, msgspec.Meta(gt=0, le=366 * 86_400)] = 30 * 86_400.0  # OpenAI's 30 days
    # one stored response: its object (instructions, tools, metadata, output) and the conversation it continues
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 << 20)] = 1 << 20
    team_max_bytes: Annotated[int, msgspec.Meta(ge=0)] = 128 << 20  # all of one team's stored responses
    team_max_responses: Annotated[int, msgspec.Meta(ge=0)] = 10_000
    # every team's stored responses together, across a fleet (PostgreSQL has no disk floor of ours): past it 503
    max_total_bytes: Annotated[int, msgspec.Meta(ge=0)] = 16 << 30
    sweep_interval_s: Annotated[float, msgspec.Meta(ge=0.1, le=86_400)] = 60.0  # expired responses purged this often


class BatchSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[batches]` table: OpenAI Files + Batches and Anthropic Message Batches (gateway/batches/README.md)."""

    max_file_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 200 << 20  # OpenAI's 200 MB per file
    max_file_lines: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 50_000  # OpenAI's 50,000 requests per batch
    team_max_file_bytes: Annotated[int, msgspec.Meta(ge=0)] = 1 << 30  # all of one team's files (uploads + results)
    # tokens a team's unfinished batches may hold (OpenAI's "enqueued tokens"), apart from its interactive tpm
    team_max_enqueued_tokens: Annotated[int, msgspec.Meta(ge=0)] = 20_000_000
    in_flight_per_endpoint: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 8  # batch lines one gateway runs at once
    lease_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 60.0  # a claimed line's lease; renewed while it runs
    poll_interval_s: Annotated[float, msgspec.Meta(ge=0.05, le=60)] = 1.0  # how often an idle runner looks again
    file_retention_s: Annotated[float, msgspec.Meta(gt=0, le=366 * 86_400)] = 30 * 86_400.0  # files expire
    max_line_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 8 << 20  # one JSONL line of an upload
    # uploads of one team in progress at once (all gateways), each within upload_timeout_s (408)
    team_max_concurrent_uploads: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 4
    # uploads one gateway process takes in at once, every team together: bounds their buffers (an S3 part each)
    max_concurrent_uploads: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 64
    upload_timeout_s: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 1800.0
    # file bodies in S3 (a fleet's gateways share it) instead of the data dir (SQLite) or the database (PostgreSQL)
    file_bucket: Annotated[str, msgspec.Meta(max_length=63, pattern=r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])?$")] = ""
    file_prefix: Annotated[str, msgspec.Meta(max_length=512)] = "batch-files/"
    s3_endpoint_url: Annotated[str, msgspec.Meta(max_length=512)] = ""  # "" = AWS; or an S3-compatible store


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8000
    data_dir: str = ".data"
    database_url: str = ""  # "" = SQLite in the data dir; or postgresql://...
    redis_url: str = ""  # "" = in-process limiter; redis://... shares limits across gateways
    # sign in to Redis (ElastiCache) as an IAM-authenticated user with short-lived tokens (gateway/redis_iam.py)
    redis_iam: RedisIamSettings = msgspec.field(default_factory=RedisIamSettings)
    # Redis away (gateway/limits/outage.py): `local` = each gateway admits within its share of every rate and
    # concurrency limit (the limit / `limiter_outage_gateways`; budgets, the budget book's, fail closed: 503),
    # `closed` = 503 limiter_unavailable, `open` = unlimited
    limiter_on_outage: Literal["local", "closed", "open"] = "local"
    limiter_outage_gateways: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 2  # most gateways sharing the limits
    limiter_fail_open: bool = False  # the older spelling of limiter_on_outage = "open" (true wins)
    # False: the first start never generates and prints a key (ECS, whose logs CloudWatch keeps): the admin key
    # must come from SLUICE_ADMIN_KEY, team keys from the CLI or the admin API; unset SLUICE_ADMIN_KEY -> exit 1
    print_bootstrap_keys: bool = True
    # the bootstrap admin key (SLUICE_ADMIN_KEY, from a secret store); "" = the first start generates one
    admin_key: str = ""
    # the pepper that keys API-key hashes (SLUICE_KEY_PEPPER); "" = a random one kept in the data dir
    key_pepper: str = ""
    # proxies (CIDRs) whose X-Forwarded-For names the client (failed-auth throttle, audit log); [] = none
    trusted_proxies: list[str] = []
    # the limits of the "default" team a new deployment creates (`sluice teams` / the admin API change them)
    default_team_limits: Limits = msgspec.field(default_factory=lambda: Limits(**DEFAULT_TEAM_LIMITS))
    pricing_file: str = ""  # TOML pricing table, re-read on change
    # the address people reach the gateway at (https://llm.example.com), for the links in account e-mails
    # (sign-in, password reset, invitations); "" = http://<host>:<port>
    public_url: Annotated[str, msgspec.Meta(max_length=500, pattern=r"^(https?://[^\s/?#]+/?)?$")] = ""
    # free space kept on the ledger log's disk for requests already admitted; below it new requests get 503
    ledger_min_free_bytes: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024 * 1024
    wal_root: str = ""  # "" = the usage WAL in the data dir; a volume shared by gateways (EFS): billing/wal_home.py
    # a request body's size; 413 past it (the smallest still holds any generation request's JSON)
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 4 * 1024 * 1024
    # live (neither revoked nor expired) keys a team's owners may have made in it; more: 409 too_many_keys
    max_keys_per_team: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 500
    # key records a team's owners may grow it to, live and ended (revoked, expired, rotated out) together; more:
    # 409 too_many_key_records (auth/bounds.py); 0 = 4 × max_keys_per_team
    max_key_records_per_team: Annotated[int, msgspec.Meta(ge=0, le=100_000_000)] = 0
    # an ended key's record is kept this long after it ended (its name labels usage), then swept
    key_retention_s: Annotated[float, msgspec.Meta(ge=0, le=10 * 366 * 86_400)] = 90 * 86_400.0
    # audit entries are kept this long, then swept (at least a day: the window of the budget below)
    audit_retention_s: Annotated[float, msgspec.Meta(ge=86_400, le=10 * 366 * 86_400)] = 366 * 86_400.0
    # audit entries a team's people may cause in 24 hours; past it owners' changes get 429 too_many_changes
    # (revoking, blocking, removing still work): a team's log holds at most about this × retention days
    team_audit_entries_per_day: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1000
    # requests refused for what they are (401; and 400, 403, 404, 413, 422 of a generation) one key and one client
    # address may make per minute; past it they get 429 with Retry-After (gateway/serving/rejections.py)
    rejections_per_minute: Annotated[int, msgspec.Meta(ge=1)] = 60
    # GET /health_generate (public) runs at most one real generation per interval; callers share its answer
    health_generate_interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0
    # the longest one generation request may run once admitted (its worker reads included); its concurrency
    # slot's lease is this plus LEASE_MARGIN_S, so a live request never loses its slot to the lease
    request_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 840.0
    # a client that takes longer to accept one write of a streamed answer is cut (gateway/edge/write_timeout.py)
    stream_write_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    # gateway processes accepting on the one listening socket (gateway/cli/processes.py); more than 1 needs redis_url
    # (limits shared through Redis) and no local workers
    gateway_processes: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    log_format: Literal["json", "console"] = "json"  # its workers' too (common/worker_settings.py)
    # SIGTERM: requests in flight get this long to finish, then the usage log drains (up to 10 s more)
    shutdown_grace_seconds: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 10.0
    models: list[EndpointSpec] = msgspec.field(default_factory=lambda: [EndpointSpec()])  # each one an endpoint
    scaling: ScalingSettings = msgspec.field(default_factory=ScalingSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)
    # GET /metrics answers this bearer token (Prometheus' `authorization`) or an admin key; "" = an admin key only
    metrics_token: Annotated[str, msgspec.Meta(max_length=512)] = ""
    # the activator's queue depth sent to CloudWatch for the Terraform alarm (off while namespace is "")
    cloudwatch: CloudWatchSettings = msgspec.field(default_factory=CloudWatchSettings)
    budget_alerts: BudgetAlertSettings = msgspec.field(default_factory=BudgetAlertSettings)
    oidc: OidcSettings = msgspec.field(default_factory=OidcSettings)
    responses: ResponsesSettings = msgspec.field(default_factory=ResponsesSettings)
    batches: BatchSettings = msgspec.field(default_factory=BatchSettings)

    def __repr__(self) -> str:  # the secrets never reach a log line or a traceback
        hidden = {name: "***" for name in SECRETS if getattr(self, name)}
        shown = {field: hidden.get(field, getattr(self, field)) for field in self.__struct_fields__}
        return f"Settings({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    @property
    def key_records_cap(self) -> int:
        return self.max_key_records_per_team or 4 * self.max_keys_per_team

    @property
    def concurrency_lease_s(self) -> float:
        """How long an unsettled concurrency slot lives (a crashed gateway's slots come back after it)."""
        return self.request_timeout_s + LEASE_MARGIN_S

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_path / 'sluice.db'}"


class ProcessesError(ValueError):
    pass


class SharedServiceError(ValueError):
    """Two entries of `[[models]]` on one ECS service."""


def check_processes(settings: Settings) -> None:
    """Several gateway processes must share what one process keeps in memory: the limits (through Redis) and
    the local workers (which one process alone starts and knows)."""
    if settings.gateway_processes == 1:
        return
    if not settings.redis_url:
        raise ProcessesError("gateway_processes > 1 needs redis_url: each process would otherwise keep its own "
                             "count of every limit")
    local = [model.name for model in settings.models if isinstance(model.provisioner, LocalProvisioning)]
    if local:
        raise ProcessesError(f"gateway_processes > 1 serves remote workers only (urls or ECS); {local[0]!r} has "
                             "local workers, which one gateway process alone can start")


def load_settings(config_file: str | None = None, **overrides) -> Settings:
    """Defaults < config file < SLUICE_* environment (gateway/environment.py) < explicit overrides (CLI flags).

    Every mistake exits with one line naming it (SystemExit); an unknown SLUICE_ variable is a warning on stderr."""
    raw: dict = {}
    inline = os.environ.get("SLUICE_CONFIG_TOML")  # the whole file in one variable (small ECS task definitions)
    stored = os.environ.get(config_object.ENV)  # an S3 object: any number of endpoints (gateway/config_object.py)
    if inline and stored and not config_file:
        raise SystemExit(f"sluice: set one of SLUICE_CONFIG_TOML and {config_object.ENV}, not both")
    if config_file or inline or stored:
        where = f"file {config_file}" if config_file else "in SLUICE_CONFIG_TOML" if inline else f"from {stored}"
        try:
            text = Path(config_file).read_text() if config_file else inline or config_object.read(stored or "")
            raw = tomllib.loads(text)
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError is a ValueError
            raise SystemExit(f"sluice: cannot read the config {where}: {exc}") from exc
    for line in environment.unknown(Settings, os.environ):
        print(line, file=sys.stderr, flush=True)
    try:
        _merge(raw, settings_env.overrides(Settings, os.environ))
    except ValueError as exc:
        raise SystemExit(f"sluice: invalid configuration in the environment: {exc}") from None
    raw.update({k: v for k, v in overrides.items() if v is not None})
    where = config_file or "the environment"
    for index, model in enumerate(raw.get("models") or []):
        try:
            check_spelling(model)
        except ValueError as exc:
            raise SystemExit(f"sluice: invalid configuration in {where}: {exc} - at `$.models[{index}]`") from None
    try:
        settings = msgspec.convert(raw, Settings)
        parse_networks(settings.trusted_proxies)
        check_processes(settings)
        check_url(settings.redis_iam, settings.redis_url)
        for index, model in enumerate(settings.models):
            if (other := sharing_service(model, settings.models[:index])) is not None:
                raise SharedServiceError(f"{service_taken(model, other)} - at `$.models[{index}]`")
    except (msgspec.ValidationError, ValueError) as exc:
        plain = (msgspec.ValidationError, ProcessesError, RedisIamError, SharedServiceError)
        field = "" if isinstance(exc, plain) else "trusted_proxies: "
        raise SystemExit(f"sluice: invalid configuration in {where}: {field}{exc} (the fields are listed under "
                         "Configuration in README.md)") from exc
    return settings


def _merge(into: dict, changes: dict) -> None:
    """`changes` over `into`, table by table (an environment variable changes one field of a file's table)."""
    for name, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(name), dict):
            _merge(into[name], value)
        else:
            into[name] = value
