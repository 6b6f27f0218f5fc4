"""`Endpoints`: the one object the request flow, the health route, the endpoint routes and the admin API
call. This docstring is the contract.

Lifecycle
    endpoints = await Endpoints.open(database_url, declared_specs, data_dir, scaling_settings,
                                     redis_url=redis_url)  # "": this gateway alone owns every endpoint
    await endpoints.start()           # loads config + stored endpoints, starts every endpoint's loop; makes no
                                      # ECS call (each ECS endpoint's owner adopts its service in the loop; one
                                      # that cannot be adopted is `failed`, never a gateway that cannot start)
    ...
    await endpoints.drain_and_stop()  # SIGTERM: no new request; every stream finishes (each replica up
                                      # to its endpoint's drain_seconds); local replicas stopped, ECS
                                      # services left as they are (another gateway owns them next); store closed

One request
    endpoint = endpoints.resolve(model, principal)   # EndpointNotFound (404) if absent, or private to
                                                     # another team (a name only: clients' aliases are
                                                     # resolved above, gateway/serving/model_aliases.py)
    endpoint = endpoints.first_visible(alias, principal)  # the first endpoint the principal may see
    deadline = wait_deadline(...)                    # deadline.py: max_wait_seconds, the request's own
                                                     # deadline, X-Scale-Up-Timeout (time.monotonic clock)
    lease = await endpoint.activator.acquire(deadline)  # the one lease API (activator.py); or
        # async with endpoint.activator.leased(deadline) as lease: ...   released however the block ends
        # (every call takes tenant=, the billed team's tag: queued requests are released in tenants' turns)
        # or endpoint.activator.take_free(): a lease at once, or None when the request would have to wait
        # or, to send SSE keep-alives while waiting:
        # async with aclosing(endpoint.activator.wait(deadline, keepalive_s=10)) as steps:
        #     async for step in steps: StillWaiting -> write a comment line; Lease -> go on
        # EndpointUnavailable (503 + Retry-After, .state, .reason, .code: queue_full | scale_up_timeout |
        # endpoint_failed | endpoint_draining); a failed endpoint raises at once
    lease.cold_start_ms                              # the wait, for the ledger (0 when a replica was free)
    events = workers.stream(endpoint, lease, generate_request, deadline)
        # the worker client (gateway/serving/worker_client.py), the one road to a worker: owns the lease from
        # here (releases it when the stream ends or is closed); retries on another replica, at most twice,
        # while nothing was relayed; WorkerLost (502, code worker_lost) when the worker dies after the first
        # event: render the dialect's error event after the tokens sent and record exactly the tokens
        # delivered with outcome worker_lost. Its other calls (tokenize, ...) lease and release by themselves.
    lease.release()                                  # only for a lease that never went to a stream

Several GenerateRequests of one client request (n > 1 fan-out): one lease each.

Views
    endpoints.states() -> list[EndpointStatus]       # every endpoint: state, reason, replica counts
    endpoints.visible(principal) -> list[...]        # GET /v1/endpoints: public ones and the team's own
    endpoints.callable(principal) -> list[...]       # those the key's allow-list names too (/v1/models)
    endpoints.healthy() -> bool                      # /health: every endpoint ready, or allowed to sleep
                                                     # (min_replicas 0) and not failed
    endpoints.router                                 # model -> pool, for the routes that read worker info
    endpoints.adapters                               # LoRA adapters per endpoint (gateway/endpoints/adapters.py): the
                                                     # spec's and the admin API's (stored; deleted with it)

Admin (POST/GET/PATCH/DELETE /admin/endpoints[/{name}], names taken whole, `/` included)
    await endpoints.create(body) -> EndpointStatus   # InvalidEndpoint (422) naming the field (a private
                                                     # endpoint's team_id must name a team: `team_exists`;
                                                     # its name must not be one of `reserved_names`);
                                                     # EndpointConflict (409) if the name exists
    endpoints.get(name) / endpoints.list()
    await endpoints.patch(name, changes)             # PATCHABLE fields only; bounds and idle time apply
                                                     # at the next tick, no restart; clears a failure
    await endpoints.delete(name)                     # drains the replicas; 409 for an endpoint
                                                     # the config file declares
    Each change is stored in the shared database, then the fleet's config version is bumped: every other
    gateway reloads (config_follower.py, `reload`) and starts, updates or stops the endpoint the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from auth.policy import sees_endpoint
from gateway.endpoints import metrics
from gateway.endpoints.adapters import AdapterRegistry
from gateway.endpoints.config_follower import ConfigFollower
from gateway.endpoints.controller import EndpointController
from gateway.endpoints.errors import EndpointConflict, EndpointNotFound, InvalidEndpoint
from gateway.endpoints.fleet import Fleet, LocalFleet, RedisFleet
from gateway.endpoints.fleet_postgres import PostgresFleet
from gateway.endpoints.lease_renewal import LeaseRenewal
from gateway.endpoints.ownership import Ownership, idle_owner_s, idle_watch_s, report_ttl
from gateway.endpoints.provisioners.base import Provisioner
from gateway.endpoints.provisioners.ecs import EcsProvisioner
from gateway.endpoints.provisioners.local import LocalProvisioner
from gateway.endpoints.provisioners.standby import StandbyWorkers
from gateway.endpoints.provisioners.static import StaticProvisioner
from gateway.endpoints.registry import EndpointRegistry
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import (
    EcsProvisioning,
    EndpointSpec,
    LocalProvisioning,
    StaticProvisioning,
    check_not_alias,
    parse_endpoint,
    service_taken,
    sharing_service,
)
from gateway.endpoints.status import EndpointStatus
from gateway.endpoints.store import EndpointStore
from gateway.replicas.pool import ReplicaRouter

if TYPE_CHECKING:
    from redis.credentials import CredentialProvider

    from auth.service import Principal

log = structlog.get_logger(__name__)
ProvisionerFactory = Callable[[EndpointSpec], Provisioner]
TeamExists = Callable[[str], Awaitable[bool]]  # the auth store's answer: is this a team's id?
CALLS_PER_LOOK = 2  # ECS API calls of one discovery (ListTasks + DescribeTasks)
STEADY_SHARE = 0.5  # of the fleet's ECS budget, for the steady polling of every endpoint together


def default_provisioners(data_dir: Path, standby: StandbyWorkers | None) -> ProvisionerFactory:
    def build(spec: EndpointSpec) -> Provisioner:
        provisioning = spec.provisioner
        if isinstance(provisioning, StaticProvisioning):
            return StaticProvisioner(provisioning.urls)
        if isinstance(provisioning, EcsProvisioning):
            return EcsProvisioner(provisioning)
        if standby is not None and (spec.min_replicas == 0 or spec.min_replicas < spec.max_replicas):
            standby.want()
        return LocalProvisioner(spec.worker_config(), data_dir, standby)

    return build


class Endpoints:
    def __init__(self, registry: EndpointRegistry, store: EndpointStore, settings: ScalingSettings,
                 provisioners: ProvisionerFactory, *, standby: StandbyWorkers | None = None,
                 on_fatal: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 read_timeout: float = 840.0, team_exists: TeamExists | None = None,
                 fleet: Fleet | None = None, reserved_names: Collection[str] = ()):
        self.registry = registry
        self.fleet = fleet or LocalFleet(settings.ecs_api_calls_per_second)  # what ECS endpoints share
        self.store = store
        self.settings = settings
        self.provisioners = provisioners
        self.standby = standby
        if standby is not None:
            standby.quiet = self.local_workers_quiet  # a spare's imports wait for them
        self.on_fatal = on_fatal
        self.clock = clock
        self.team_exists = team_exists  # None: no team to check against (tests of the scaling machinery)
        self.reserved_names = frozenset(reserved_names)  # the model aliases of the layer above, lower case
        self.router = ReplicaRouter(read_timeout=read_timeout)  # settings.request_timeout_s
        self.controllers: dict[str, EndpointController] = {}
        self.adapters = AdapterRegistry(store, self._declared_adapters)  # LoRA adapters per endpoint
        self._admin = asyncio.Lock()  # one admin change (or reload) at a time
        self.follower: ConfigFollower | None = None  # a fleet's other gateways' changes (not a lone gateway)
        self.renewal: LeaseRenewal | None = None  # the idle owners' leases, renewed together (not a lone gateway)
        self._stopping = False

    @classmethod
    async def open(cls, database_url: str, declared: Iterable[EndpointSpec], data_dir: Path,
                   settings: ScalingSettings | None = None, *, provisioners: ProvisionerFactory | None = None,
                   on_fatal: Callable[[str], None] | None = None, read_timeout: float = 840.0,
                   team_exists: TeamExists | None = None, redis_url: str = "",
                   redis_credentials: CredentialProvider | None = None,
                   reserved_names: Collection[str] = ()) -> Endpoints:
        """`on_fatal(line)`: called when the only endpoint, declared in the config and run by local
        workers, fails before it was ever ready (the embedded setup cannot serve: `sluice serve` exits).
        `read_timeout`: the longest wait for a worker's next bytes (settings.request_timeout_s).
        `team_exists`: whether a private endpoint's `team_id` names a team (the gateway asks the auth store).
        `reserved_names`: model names that stand for something else (the clients' aliases that the serving layer
        resolves, gateway/serving/model_aliases.py): no endpoint, declared or created, may be named one.
        `redis_url`: where the fleet shares ECS endpoints' state (fleet.py); "" = in the database when it is
        PostgreSQL (fleet_postgres.py), else this gateway alone; `redis_credentials` sign in to it at each new
        connection (ElastiCache IAM, gateway/redis_iam.py), None: the URL's own."""
        settings = settings or ScalingSettings()
        standby = StandbyWorkers() if settings.standby_worker and provisioners is None else None
        store = await EndpointStore.open(database_url)
        calls = settings.ecs_api_calls_per_second
        try:
            if redis_url:
                fleet: Fleet = RedisFleet(redis_url, calls_per_second=calls, credentials=redis_credentials)
            elif database_url.startswith(("postgres://", "postgresql://")):
                fleet = await PostgresFleet.open(database_url, calls_per_second=calls)
            else:
                fleet = LocalFleet(calls)
        except BaseException:
            await store.close()
            raise
        return cls(EndpointRegistry(store, declared), store, settings,
                   provisioners or default_provisioners(data_dir, standby), standby=standby, on_fatal=on_fatal,
                   read_timeout=read_timeout, team_exists=team_exists, fleet=fleet, reserved_names=reserved_names)

    # ---- lifecycle ----

    async def start(self) -> None:
        """InvalidEndpoint when an endpoint of the config file has a reserved name or names a team that does not
        exist."""
        async with self._admin:  # a reload waits for the first load
            if not isinstance(self.fleet, LocalFleet):
                sync_s, lease_s = self.settings.fleet_sync_seconds, self.settings.lease_seconds
                self.follower = ConfigFollower(
                    self.fleet, self.reload, self.settings.fleet_config_check_seconds,
                    ownerships=self._shared_ownerships, watch_s=idle_watch_s(sync_s, lease_s),
                    alive_s=report_ttl(sync_s, lease_s))
                await self.follower.start()  # the version first: a change stored after it is reloaded
                self.renewal = LeaseRenewal(self.fleet, self._shared_ownerships,
                                            renew_s=idle_owner_s(sync_s, lease_s), lease_s=lease_s)
                self.renewal.start()
            specs = await self.registry.load()
            for spec in specs:
                if self.registry.declared(spec.name):  # the API's were checked when created or patched
                    self._check_name(spec.name)
                    await self._check_team(spec.team_id, f"the endpoint {spec.name!r} of the config file")
            await self.adapters.load({spec.name for spec in specs})
            for spec in specs:  # the file's entries first: of two on one ECS service, the file's serves it
                try:
                    await self._launch(spec)
                except EndpointConflict as error:  # a stored endpoint on a service the edited file now names
                    log.error("endpoint_service_taken", endpoint=spec.name, reason=str(error))

    def _shared_ownerships(self) -> list[Ownership]:
        return [c.ownership for c in self.controllers.values() if c.provisioner.shared]

    async def reload(self) -> None:
        """Another gateway changed endpoints: start the created ones, update the patched ones (bounds, idle time,
        a cleared failure), stop the deleted ones (their replicas drained; the owner of a shared one scales its
        service to 0), as that gateway did."""
        async with self._admin:
            await self._reconcile()

    async def _reconcile(self) -> None:
        specs = {spec.name: spec for spec in await self.registry.load(prune=False)}
        # a row this version cannot read (a newer gateway wrote it mid-deploy) is no delete: that endpoint runs on
        gone = [name for name in self.controllers if name not in specs and name not in self.registry.unreadable]
        # a name deleted and created again on another service (or provisioner) meanwhile: the old one is deleted
        replaced = [name for name, c in self.controllers.items() if name in specs
                    and c.spec.provisioner != specs[name].provisioner]
        await asyncio.gather(*(self._stop_deleted(name) for name in gone + replaced))
        for name, spec in specs.items():
            controller = self.controllers.get(name)
            if controller is None and self._stopping:
                continue
            if controller is None:
                try:
                    await self._launch(spec)
                except Exception as error:  # its gateway started it; here it waits for the next change
                    log.error("endpoint_reload_start_failed", endpoint=name, error=str(error)[:500])
            elif controller.spec != spec:
                controller.update(spec)

    async def _follow(self) -> None:
        """Before an admin change: take in the fleet's newer changes, so that this one builds on them."""
        if self.follower is not None:
            await self.follower.catch_up(self._reconcile)

    async def _announce(self, spec: EndpointSpec) -> None:
        """After an admin change was stored: a new spec clears the fleet's failure mark; tell every gateway."""
        if self.follower is None:
            return
        await self.fleet.clear_failed(spec.fleet_key)
        await self.fleet.bump_config()

    def stop_accepting(self) -> None:
        """SIGTERM's first step (gateway/cli/draining.py): every endpoint refuses new requests with a 503 in
        state `draining`; the requests already on a replica go on."""
        self._stopping = True  # a reload from now on starts no endpoint here
        for controller in self.controllers.values():
            controller.stop_accepting()

    @property
    def in_flight(self) -> int:
        """Requests holding a replica, over every endpoint."""
        return sum(controller.in_flight for controller in self.controllers.values())

    @property
    def waiting(self) -> int:
        """Requests waiting in an activator for a replica, over every endpoint."""
        return sum(controller.activator.waiting for controller in self.controllers.values())

    def local_workers_quiet(self) -> bool:
        """No local worker process is starting, busy or waited for (a standby spare spawns only then)."""
        local = [c.status() for c in self.controllers.values() if isinstance(c.provisioner, LocalProvisioner)]
        return not any(s.replicas.starting or s.in_flight or s.waiting for s in local)

    async def drain_and_stop(self) -> None:
        if self.renewal is not None:  # first: a stopping gateway renews no lease (each endpoint resigns its own)
            await self.renewal.close()
        if self.follower is not None:
            await self.follower.close()
        controllers, self.controllers = list(self.controllers.values()), {}
        await asyncio.gather(*(c.drain_and_stop() for c in controllers))
        if self.standby is not None:
            await self.standby.close()
        await self.fleet.close()
        await self.router.close()
        await self.store.close()

    async def _launch(self, spec: EndpointSpec, *, check: bool = False) -> EndpointController:
        """Start the endpoint's loop. An ECS endpoint makes no ECS call here (its owner adopts the service in the
        loop, within the fleet's budget): a gateway serves at once, whatever ECS says; `check` (an admin create)
        asks ECS once whether the service exists."""
        taken = sharing_service(spec, (c.spec for c in self.controllers.values()))
        if taken is not None:  # two loops here would both act as the service's owner
            raise EndpointConflict(service_taken(spec, taken))
        provisioner = self.provisioners(spec)
        if isinstance(provisioner, EcsProvisioner) and provisioner.budget is None:
            provisioner.budget = self.fleet.take_call  # every ECS call of the fleet within one budget
        controller = EndpointController(spec, provisioner, self.router, self.settings, on_failed=self._failed,
                                        fleet=self.fleet if provisioner.shared else None, clock=self.clock,
                                        batched=self.renewal is not None)
        self.controllers[spec.name] = controller
        self._pace_discovery()
        try:
            await controller.start(check=check)
        except BaseException:
            del self.controllers[spec.name]
            await controller.drain_and_stop()
            raise
        return controller

    def _pace_discovery(self) -> None:
        """Each ECS endpoint's owner looks at its tasks every (ECS endpoints x calls per look / half the
        fleet's budget) seconds while none is starting: every endpoint's steady polling together takes half
        the budget, which leaves the other half to endpoints with a task starting and to writes (README.md)."""
        shared = [c.provisioner for c in self.controllers.values() if isinstance(c.provisioner, EcsProvisioner)]
        steady_budget = STEADY_SHARE * self.settings.ecs_api_calls_per_second
        interval = max(1.0, len(shared) * CALLS_PER_LOOK / steady_budget)
        for provisioner in shared:
            provisioner.steady_interval_s = interval

    def _failed(self, controller: EndpointController) -> None:
        embedded = (len(self.controllers) == 1 and self.registry.declared(controller.name)
                    and isinstance(controller.spec.provisioner, LocalProvisioning) and controller.spec.min_replicas > 0)
        if embedded and self.on_fatal is not None and not controller.ever_started:
            self.on_fatal(f"the endpoint {controller.name!r} failed: {controller.failure}")

    def _declared_adapters(self, name: str) -> dict[str, str]:
        spec = self.registry.get(name)
        return spec.adapters if spec is not None else {}

    # ---- one request ----

    def resolve(self, model: str, principal: Principal | None) -> EndpointController:
        controller = self.controllers.get(model)
        if controller is None or not _may_see(controller.spec, principal):
            raise EndpointNotFound(model)
        return controller

    def first_visible(self, alias: str, principal: Principal | None) -> EndpointController:
        """The first endpoint the principal may see, for a model name that stands for it (`alias`, named by the
        404 when there is none)."""
        controller = next((c for c in self.controllers.values() if _may_see(c.spec, principal)), None)
        if controller is None:
            raise EndpointNotFound(alias)
        return controller

    # ---- views ----

    def states(self) -> list[EndpointStatus]:
        return [c.status() for c in self.controllers.values()]

    def visible(self, principal: Principal | None) -> list[EndpointStatus]:
        return [c.status() for c in self.controllers.values() if _may_see(c.spec, principal)]

    def callable(self, principal: Principal | None) -> list[EndpointStatus]:
        """The visible endpoints that the key's allow-list (empty: every one) names too."""
        allowed = principal.models if principal is not None else ()
        return [status for status in self.visible(principal) if not allowed or status.name in allowed]

    def healthy(self) -> bool:
        return all(status.healthy for status in self.states())

    # ---- admin ----

    def get(self, name: str) -> EndpointStatus:
        controller = self.controllers.get(name)
        if controller is None:
            raise EndpointNotFound(name)
        return controller.status()

    def list(self) -> list[EndpointStatus]:
        return self.states()

    async def create(self, body: Any) -> EndpointStatus:
        try:
            spec = body if isinstance(body, EndpointSpec) else parse_endpoint(body)
        except (msgspec.ValidationError, ValueError) as error:
            raise InvalidEndpoint(str(error)) from error
        self._check_name(spec.name)
        await self._check_team(spec.team_id, "a private endpoint")
        async with self._admin:
            await self._follow()
            await self.registry.create(spec)
            try:
                controller = await self._launch(spec, check=True)
            except Exception as error:  # e.g. its ECS service does not exist: nothing is kept
                await self.registry.delete(spec.name)
                raise InvalidEndpoint(f"the endpoint {spec.name!r} cannot start: {error}") from error
            await self._announce(spec)
            log.info("endpoint_created", endpoint=spec.name)
            return controller.status()

    async def patch(self, name: str, changes: dict[str, Any]) -> EndpointStatus:
        team_id = changes.get("team_id")
        if isinstance(team_id, str) and self.registry.get(name) is not None:  # else the spec's own message, a 404
            await self._check_team(team_id, "a private endpoint")
        async with self._admin:
            await self._follow()
            spec = await self.registry.patch(name, changes)
            controller = self.controllers.get(name)
            if controller is None:  # its start failed here at a reload: the patch is a retry
                controller = await self._launch(spec)
            else:
                controller.update(spec)
            await self._announce(spec)
            log.info("endpoint_patched", endpoint=name, fields=sorted(changes))
            return controller.status()

    async def delete(self, name: str) -> None:
        async with self._admin:
            await self._follow()
            self.registry.check_deletable(name)
            spec = self.registry.get(name)
            await self.registry.delete(name)  # stored first: the other gateways stop routing and scaling it now
            await self.adapters.forget(name)
            await self._announce(spec)
            await self._stop_deleted(name)
            log.info("endpoint_deleted", endpoint=name)

    async def _stop_deleted(self, name: str) -> None:
        controller = self.controllers.pop(name)
        await controller.drain_and_stop(keep_shared=False)  # a deleted endpoint's ECS service goes to 0
        self._pace_discovery()
        self.router.drop_pool(name)
        metrics.forget(name)

    def _check_name(self, name: str) -> None:
        try:
            check_not_alias(name, self.reserved_names)
        except ValueError as error:
            raise InvalidEndpoint(str(error)) from error

    async def _check_team(self, team_id: str | None, what: str) -> None:
        if team_id is None or self.team_exists is None or await self.team_exists(team_id):
            return
        raise InvalidEndpoint(f"`team_id`: {what} belongs to a team, and {team_id[:80]!r} is no team's id; create "
                              "the team first (POST /admin/teams or `sluice teams create`) and give its id",
                              param="team_id")


def _may_see(spec: EndpointSpec, principal: Principal | None) -> bool:
    if principal is None:
        return sees_endpoint(spec.team_id, is_admin=False, team_id=None)
    return sees_endpoint(spec.team_id, is_admin=principal.is_admin, team_id=principal.team_id)
