"""The gateway's lifespan as a Litestar plugin: it opens the services (the database, auth, limiter, pricing,
ledger, the endpoints with their replicas) when the app starts, closes whatever it opened in reverse order
when it stops or when a later step fails, and provides them to handlers by dependency injection (`services`, `ledger`;
the auth package reads `app.state.auth`).

A step that fails at start raises `StartupError` with one line saying what failed and how to fix it; the
line is kept in `app.state.startup_failure` for `sluice serve`, which prints it and exits 1. A new start-up
step (a model source that cannot load, say) raises `StartupError` the same way.
"""

from __future__ import annotations

import asyncio
import re
import time
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import structlog
from botocore.exceptions import BotoCoreError
from litestar import Litestar
from litestar.config.app import AppConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.plugins import InitPluginProtocol

import storage
from auth import AuthService, Bootstrap, RecordBounds
from billing.ledger import Ledger
from billing.pricing import PricingError, PricingTable
from billing.wal_home import WalHome, orphan_sweeper
from common.errors import StoreUnavailable
from gateway.authentication.middleware import STATE_KEY
from gateway.batches.service import BatchService, open_batches
from gateway.config import Settings
from gateway.dialects.responses.store import policy_of, response_store
from gateway.dialects.responses.sweep import response_sweeper
from gateway.edge import startup_failure as shutdown
from gateway.endpoints.errors import InvalidEndpoint
from gateway.endpoints.provisioners.base import Provisioner
from gateway.endpoints.provisioners.static import StaticProvisioner
from gateway.endpoints.queue_metric import QueueDepthPublisher
from gateway.endpoints.service import Endpoints, ProvisionerFactory, TeamExists, default_provisioners
from gateway.endpoints.spec import EndpointSpec, LocalProvisioning
from gateway.limits import open_limiter
from gateway.redis_iam import IamCredentialProvider, RedisIamError
from gateway.secrets import key_pepper
from gateway.serving.budget_alerts import AlertSender
from gateway.serving.budget_gate import BudgetGate
from gateway.serving.health_alerts import HealthWatch
from gateway.serving.health_probe import GenerationProbe
from gateway.serving.model_aliases import MODEL_ALIASES
from gateway.serving.rejections import address_budget
from gateway.serving.services import Services
from gateway.serving.spending import SpendReader
from gateway.serving.worker_client import WorkerClient

log = structlog.get_logger("gateway")
STATE_FAILURE = "startup_failure"


class StartupError(Exception):
    """A start-up step failed in a way the operator must fix; the message says what and how, in one line."""


def redacted(url: str) -> str:
    """A database URL without its password."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _cause(error: BaseException) -> str:
    cause = error.__cause__ or error
    return f"{type(cause).__name__}: {cause}".strip().rstrip(":")


async def redis_credentials(settings: Settings) -> IamCredentialProvider | None:
    """What signs the gateway's Redis clients in: ElastiCache IAM tokens with `[redis_iam]`, else None (the
    URL's own user and password, if any)."""
    if not settings.redis_iam.user:
        return None
    try:  # resolving the task role's credentials may call the ECS credentials endpoint: off the event loop
        return await asyncio.to_thread(IamCredentialProvider, settings.redis_iam)
    except RedisIamError as error:
        raise StartupError(str(error)) from error
    except BotoCoreError as error:  # a broken AWS config file, a credentials endpoint that fails
        raise StartupError(f"cannot sign Redis IAM tokens ({_cause(error)}): fix the AWS credentials of this "
                           "process, or unset redis_iam.user") from error


def database_failure(url: str, error: BaseException) -> StartupError:
    return StartupError(f"cannot open the database {redacted(url)} ({_cause(error)}): check database_url "
                        "(or SLUICE_DATABASE_URL) and that the database server is running and reachable")


def announce(bootstrap: Bootstrap) -> None:
    """Clear keys are shown once, on stdout, never logged."""
    if bootstrap.admin_key:
        print(f"Sluice admin key (shown once, store it now): {bootstrap.admin_key}", flush=True)
    if bootstrap.first_key:
        print(f"Sluice API key for team 'default' (shown once): {bootstrap.first_key}", flush=True)


def provide_services(state: State) -> Services:
    return state.services


def provide_ledger(state: State) -> Ledger | None:
    return state.services.ledger


def provide_batches(state: State) -> BatchService:
    return state.batches


class GatewayServices(InitPluginProtocol):
    """`supervise=False` starts no local worker: an endpoint of the local provisioner then has no replica (tests
    of the routes themselves), while static and ECS endpoints work as configured. `ledger=False` opens no usage
    ledger (the baseline of bench/ledger_gateway.py)."""

    def __init__(self, settings: Settings, *, supervise: bool = True, ledger: bool = True) -> None:
        self.settings = settings
        self.supervise = supervise
        self.ledger = ledger

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        app_config.lifespan.append(self.lifespan)
        app_config.dependencies.update(services=Provide(provide_services, sync_to_thread=False),
                                       ledger=Provide(provide_ledger, sync_to_thread=False),
                                       batches=Provide(provide_batches, sync_to_thread=False))
        return app_config

    @asynccontextmanager
    async def lifespan(self, app: Litestar):
        async with AsyncExitStack() as opened:
            try:
                app.state.services = await self._open(opened)
                app.state.batches = open_batches(app.state.services)
                await app.state.batches.store.migrated()
                opened.push_async_callback(app.state.batches.runner.start().stop)
            except StartupError as error:
                app.state[STATE_FAILURE] = str(error)
                raise
            except Exception as error:
                log.exception("startup_failed")
                app.state[STATE_FAILURE] = f"start-up failed unexpectedly ({_cause(error)}); see the log above"
                raise
            app.state[STATE_KEY] = app.state.services.auth
            settings = self.settings
            print(f"Sluice gateway listening on http://{settings.host}:{settings.port} "
                  f"(models: {', '.join(m.name for m in settings.models)})", flush=True)
            yield
        log.info("gateway_stopped")

    async def _open(self, opened: AsyncExitStack) -> Services:
        settings = self.settings
        data = settings.data_path
        try:
            data.mkdir(parents=True, exist_ok=True)
            pepper = key_pepper(settings)
        except OSError as error:
            raise StartupError(f"cannot use the data directory {data} ({error.strerror}): choose a writable one "
                               "with --data-dir (or data_dir / SLUICE_DATA_DIR)") from error
        wal = None
        if self.ledger:  # claimed before anything prints keys: a bad wal_root fails alone
            try:
                wal = WalHome.claim(data, settings.wal_root)
            except OSError as error:
                raise StartupError(f"cannot use wal_root {settings.wal_root} ({error.strerror}): mount the shared "
                                   "volume there, or unset wal_root (SLUICE_WAL_ROOT)") from error
            opened.callback(wal.release)  # runs after the ledger closed: a fully shipped log leaves nothing on disk
        url = settings.resolved_database_url
        try:  # the one pool of this URL: every store below takes a handle on it; it closes last, once
            database = await storage.open(url)
        except (StoreUnavailable, ValueError) as error:
            raise database_failure(url, error) from error
        opened.push_async_callback(database.close)
        signer = await redis_credentials(settings)
        limiter = open_limiter(settings.redis_url or None, fail_open=settings.limiter_fail_open,
                               on_outage=settings.limiter_on_outage, outage_gateways=settings.limiter_outage_gateways,
                               concurrency_lease=settings.concurrency_lease_s, credentials=signer)
        opened.push_async_callback(limiter.close)
        try:
            auth = await AuthService.open(url, pepper, trusted_proxies=settings.trusted_proxies,
                                          default_team_limits=settings.default_team_limits,
                                          max_keys_per_team=settings.max_keys_per_team,
                                          record_bounds=RecordBounds(
                                              key_records=settings.key_records_cap,
                                              key_retention_s=settings.key_retention_s,
                                              audit_retention_s=settings.audit_retention_s,
                                              audit_per_day=settings.team_audit_entries_per_day),
                                          failure_budget=address_budget(limiter, settings.rejections_per_minute))
        except (StoreUnavailable, ValueError) as error:
            raise database_failure(url, error) from error
        opened.push_async_callback(auth.close)
        admin_key = settings.admin_key or None
        if admin_key is None and not settings.print_bootstrap_keys:  # checked before any key is made
            raise StartupError("print_bootstrap_keys is false but SLUICE_ADMIN_KEY is unset: inject the admin key "
                               "from Secrets Manager (the Terraform does), or set print_bootstrap_keys = true "
                               "where the console is private")
        try:
            announce(await auth.bootstrap(admin_key, issue_first_key=settings.print_bootstrap_keys))
        except ValueError as error:  # an admin key of no usable shape
            raise StartupError(str(error)) from error
        ledger = None
        if self.ledger:
            try:
                pricing = PricingTable(settings.pricing_file or None, section="pricing")
            except (OSError, PricingError, ValueError) as error:
                raise StartupError(f"cannot read pricing_file {settings.pricing_file} ({_cause(error)}): fix the "
                                   "file, or unset pricing_file") from error
            try:
                ledger = await Ledger.open(url, wal.path, pricing, min_free_bytes=settings.ledger_min_free_bytes)
            except StoreUnavailable as error:
                raise database_failure(url, error) from error
            opened.push_async_callback(ledger.close)
            if (sweeper := orphan_sweeper(wal, url, pricing)) is not None:
                opened.push_async_callback(sweeper.start().stop)
        try:
            endpoints = await Endpoints.open(url, settings.models, data, settings.scaling,
                                             provisioners=None if self.supervise else _no_local_workers(data),
                                             on_fatal=shutdown.fail, read_timeout=settings.request_timeout_s,
                                             team_exists=_team_lookup(auth), redis_url=settings.redis_url,
                                             redis_credentials=signer, reserved_names=MODEL_ALIASES)
        except StoreUnavailable as error:
            raise database_failure(url, error) from error
        opened.push_async_callback(endpoints.drain_and_stop)
        try:
            await endpoints.start()
        except InvalidEndpoint as error:  # a config entry the store contradicts (a team that does not exist)
            raise StartupError(f"invalid configuration: {error.message}") from error
        except Exception as error:  # a local provisioner that cannot start (ECS services are adopted in the loop)
            raise StartupError(f"an endpoint cannot start ({_cause(error)}): fix its provisioner settings, or "
                               "delete it with DELETE /admin/endpoints/{name}") from error
        if settings.cloudwatch.namespace:
            try:
                publisher = QueueDepthPublisher(settings.cloudwatch, lambda: endpoints.waiting)
            except Exception as error:  # botocore: no region, an unknown one
                raise StartupError(f"cannot publish to CloudWatch ({_cause(error)}): set cloudwatch.region (or "
                                   "AWS_REGION), or unset cloudwatch.namespace") from error
            opened.push_async_callback(publisher.start().stop)
        responses = response_store(auth.store.db, policy_of(settings))
        opened.push_async_callback(response_sweeper(responses, settings.responses.sweep_interval_s).start().stop)
        workers = WorkerClient(endpoints)
        probe = GenerationProbe(workers, settings.health_generate_interval_s)
        opened.push_async_callback(probe.close)
        sender = AlertSender(settings.budget_alerts)
        budgets = BudgetGate(ledger.store if ledger else None, ledger.pricing if ledger else None,
                             sender, redis_url=settings.redis_url or None,
                             fail_open=settings.limiter_fail_open, credentials=signer)
        opened.push_async_callback(budgets.close)  # closes the sender, after the health alerts' last sends
        health = HealthWatch(sender, ledger)
        opened.push_async_callback(health.close)
        return Services(settings, endpoints, auth, limiter, ledger, started_at=time.time(), workers=workers,
                        probe=probe, budgets=budgets, spending=SpendReader(ledger.store) if ledger else None,
                        health=health)


def _team_lookup(auth: AuthService) -> TeamExists:
    async def team_exists(team_id: str) -> bool:
        return await auth.store.get_team(team_id) is not None

    return team_exists


def _no_local_workers(data: Path) -> ProvisionerFactory:
    local = default_provisioners(data, standby=None)

    def build(spec: EndpointSpec) -> Provisioner:
        return StaticProvisioner([]) if isinstance(spec.provisioner, LocalProvisioning) else local(spec)

    return build
