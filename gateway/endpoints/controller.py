"""One endpoint at run time: its replicas, activator and autoscaler, and the loop that keeps them agreeing.

Every tick (and at once when a request starts waiting) the loop:
1. looks at what the provisioner runs (new replicas join the pool; exits are counted: a replica that
   exits before it was ever ready extends the start-failure streak, `start_failures` in a row or a
   worker that says its model cannot load make the endpoint `failed`);
2. polls `/load` of starting replicas (every tick) and ready ones (every `health_interval_seconds`): a
   replica is ready only when its worker says so; one not ready after `start_timeout_seconds` is a
   failed start too;
3. samples demand (in flight + waiting), asks the autoscaler for the replica count, and starts
   replicas or drains ready ones (never one that is starting);
4. releases queued requests onto replicas with room.

A drained replica takes no new request, finishes what it has (up to the endpoint's `drain_seconds`),
then is stopped. A failed endpoint refuses requests at once and stops its replicas; a PATCH of its
spec is the operator's retry and clears the failure. A shared endpoint's failure is the fleet's (fleet.py): the
owner that saw it stores it at its next sync, every other gateway takes it from there (and refuses at once),
a new owner after a lease move starts nothing, and a PATCH on any gateway clears it everywhere.

Replicas a fleet shares (`provisioner.shared`: ECS) have one owner at a time (ownership.py): every
gateway publishes its demand and reads the fleet's, but only the owner looks at ECS, scales, drains and
times out starts; the others take the owner's replica list and its draining marks. A replica is only
removed once no gateway has a request on it, and a stopping gateway leaves shared replicas running.

A shared endpoint starts without a call to its platform: `start` returns at once and the owner adopts the
service (its count) in its loop, backing off while ECS throttles (the provisioner's jittered backoff). A
service that cannot be adopted (missing, a bad cluster or region, refused) makes this endpoint `failed` with
the platform's answer, touches nothing, and is tried again every `ADOPT_RETRY_S` (a PATCH retries at once):
one broken endpoint never keeps a gateway, or a fleet, from starting. A new owner neither scales nor removes
anything before its first look at the tasks since it adopted the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gateway.endpoints import metrics
from gateway.endpoints.activator import Activator, Availability
from gateway.endpoints.autoscaler import Autoscaler, Bounds, plan
from gateway.endpoints.fleet import Failure, Fleet, LocalFleet, Report
from gateway.endpoints.ownership import Ownership
from gateway.endpoints.provisioners.base import (
    FenceLost,
    Observation,
    Provisioner,
    ProvisionerBackoff,
    ReplicaAddress,
    ReplicaExit,
)
from gateway.endpoints.repeated_failure import RepeatedFailure
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import EcsProvisioning, EndpointSpec
from gateway.endpoints.status import EndpointStatus, ReplicaCounts
from gateway.lifecycle import Background
from gateway.replicas.pool import Replica, ReplicaRouter

log = structlog.get_logger(__name__)
FIRST_START_GUESS_S = 10.0  # Retry-After before any replica of the endpoint has started
FAILED_RETRY_AFTER_S = 30.0
DRAIN_CHECK_S = 0.05
BUSY_TICK_S = 0.05
ADOPT_RETRY_S = 30.0  # a service that could not be adopted is tried again this often
ADOPT_FAILED = "service unavailable"  # the tenant's reason when the platform's service cannot be adopted
DRAIN_STOP_MARGIN_S = 60.0  # past its drain_seconds, what a drain gets to stop its replica (a worker, an ECS task)
LOOP_STOP_S = 10.0  # the longest a stopping endpoint waits for its loop's current tick before going on without it
LOST_LOOK_S = 5.0  # discovery pace while a serving replica is down (0.4 ECS calls/s, a fifth of the default budget)
LOST_LOOK_FOR_S = 120.0  # ... for at most this long after it went down (ECS stops and replaces a task sooner)


@dataclass(eq=False)
class Member:
    """A replica the provisioner reported, with or without an address yet."""

    replica_id: str
    since: float
    replica: Replica | None = None
    last_poll: float = -math.inf
    started: bool = False  # its readiness was counted
    drained_here: bool = False  # this gateway runs its drain (the owner; a new owner takes over a drain)
    down_since: float | None = None  # when it was first polled down after serving

    @property
    def ready(self) -> bool:
        return self.replica is not None and self.replica.ever_ready

    @property
    def draining(self) -> bool:
        return self.replica is not None and self.replica.draining


class EndpointController:
    def __init__(self, spec: EndpointSpec, provisioner: Provisioner, router: ReplicaRouter,
                 settings: ScalingSettings, *,
                 on_failed: Callable[[EndpointController], None] = lambda controller: None,
                 fleet: Fleet | None = None, clock: Callable[[], float] = time.monotonic, batched: bool = False):
        """`fleet`: the shared state of the gateways that serve this endpoint's shared replicas (default:
        this gateway alone, which owns the endpoint); `batched`: the gateway's LeaseRenewal renews its lease while
        it is idle (lease_renewal.py)."""
        self.spec = spec
        self.name = spec.name
        self.provisioner = provisioner
        self.router = router
        self.pool = router.ensure_pool(spec.name)
        self.settings = settings
        self.on_failed = on_failed
        self.clock = clock
        self.autoscaler = Autoscaler(settings, clock())
        self.activator = Activator(spec.name, self.pool, self.availability, self.poke, max_waiting=spec.max_waiting,
                                   release_limit=1, clock=clock)
        self.activator.configure(max_waiting=spec.max_waiting, target_concurrency=spec.target_concurrency,
                                 burst_factor=settings.burst_factor,
                                 capacity=spec.max_batch_size + spec.max_queue)
        self.members: dict[str, Member] = {}
        self.failure: str | None = None  # why it failed, in full: the operator's (log, admin views)
        self.failure_reason: str | None = None  # the same in a fixed phrase: what a tenant is told
        self._failure_shared = False  # the fleet's state holds this failure (from here on it is the authority)
        self.stopping = False
        self.desired = 0
        self.start_streak = 0
        self.expected_start_s = FIRST_START_GUESS_S  # how long a replica takes to become ready (for Retry-After)
        self._starts_seen = 0
        self._next_start = -math.inf  # backoff after failed starts
        self._next_observe = -math.inf
        self._wake = asyncio.Event()
        self._loop: asyncio.Task | None = None
        self._closing = False  # the loop ends and the lease is no longer renewed (a cancel alone may be swallowed)
        self._sync_failure = RepeatedFailure("fleet_sync_failed", endpoint=spec.name)
        self._tick_failure = RepeatedFailure("endpoint_tick_failed", endpoint=spec.name)
        self._drains = Background(f"endpoint {spec.name} drains")  # replicas being drained or removed
        self.ownership = Ownership(fleet or LocalFleet(), spec.fleet_key, sync_s=settings.fleet_sync_seconds,
                                   lease_s=settings.lease_seconds, poke=self.poke, batched=batched)
        self._adopted = False  # this owner read the provisioner's state since it took the lease
        self._looked = False  # ... and looked at its replicas since: it may scale
        self._next_adopt = -math.inf
        self._adopt_failed = False  # the failure is the adoption's: a later adoption clears it
        if provisioner.shared:
            provisioner.fence = self.ownership.write_window  # checked immediately before each write
        self._turned_away = 0  # requests refused for a full queue since the last publish
        self._hold_until = -math.inf  # a new owner removes no replica before this

    # ---- lifecycle ----

    async def start(self, *, check: bool = False) -> None:
        """A shared endpoint returns at once (its owner adopts the service in the loop); `check` first asks the
        platform once whether the service exists (an admin create: refused at once when it does not)."""
        if not self.provisioner.shared:
            await self.provisioner.open()
            self._adopted = self._looked = True
            await self.tick()
        elif check:
            await self.provisioner.open()
        self._loop = asyncio.create_task(self._run(), name=f"endpoint {self.name}")

    def poke(self) -> None:
        self._wake.set()

    @property
    def adopted(self) -> bool:
        """This gateway owns the endpoint, has read its service and looked at its replicas since: it may scale."""
        return self.ownership.owner and self._adopted and self._looked

    @property
    def ever_started(self) -> bool:
        """A replica of this endpoint was ready at least once."""
        return self._starts_seen > 0

    def update(self, spec: EndpointSpec) -> None:
        """A PATCH: bounds, target and idle time apply from the next tick; a failure is cleared."""
        self.spec = spec
        self.activator.configure(max_waiting=spec.max_waiting, target_concurrency=spec.target_concurrency,
                                 burst_factor=self.settings.burst_factor,
                                 capacity=spec.max_batch_size + spec.max_queue)
        if self.failure is not None:
            self._clear_failure()
            self._next_adopt = -math.inf
        self.poke()

    def _clear_failure(self) -> None:
        log.info("endpoint_failure_cleared", endpoint=self.name)
        self.failure, self.failure_reason, self.start_streak, self._next_start = None, None, 0, -math.inf
        self._failure_shared = False

    def stop_accepting(self) -> None:
        """No new request from now on (503, `draining`), and none waiting; running streams go on."""
        self.stopping = True
        self.activator.reject_all("endpoint_draining", "the endpoint is shutting down")

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.pool.replicas)

    async def drain_and_stop(self, *, keep_shared: bool = True) -> None:
        """Take no new request, let every replica finish its streams (each up to `drain_seconds`), stop.
        Shared replicas (ECS) are left as they are unless `keep_shared` is False (the endpoint is deleted):
        this gateway only waits for its own requests on them and gives its lease to another gateway."""
        self.stop_accepting()
        await self._stop_loop()
        if self.provisioner.shared and keep_shared:
            await self._leave_shared()
            return
        for member in list(self.members.values()):
            if member.replica is not None and not member.draining:
                self._begin_drain(member)
            elif member.replica is None:
                await self._remove(member)
        while self._drains:  # each bounded by the endpoint's drain_seconds and its replica's stop
            await self._drains.stop(self.spec.drain_seconds + DRAIN_STOP_MARGIN_S, cancel=False)
        if self.provisioner.shared:  # deleted: the service went to 0 (if this gateway owned it); let go
            await self._remove_unseen()
            await self._resign()
        await self.provisioner.close()
        for member in list(self.members.values()):
            await self._forget(member)
        self._publish()

    async def _remove_unseen(self) -> None:
        """A deleted shared endpoint's owner also removes the replicas it had not seen yet (a task asked for a
        moment ago) or could not remove (its lease ran out while the loop was stopped): else the service kept them
        with no gateway left to scale it. Every gateway stopping it claims the lease for this; one gets it."""
        deadline = self.clock() + LOOP_STOP_S
        while self.clock() < deadline:
            try:
                await self.ownership.sync(self.clock(), Report(0.0))  # renew, or take the lapsed lease
                if not self.ownership.owner:
                    return  # another gateway holds it, and stops the rest itself
                unseen = (await self.provisioner.observe()).replicas
                for address in unseen:
                    await self._remove(Member(address.replica_id, self.clock()))
                if not unseen:
                    return
            except ProvisionerBackoff as backoff:
                await asyncio.sleep(backoff.retry_in)
            except Exception:  # the shared state or ECS away: what is left stays for the operator (logged)
                log.warning("endpoint_delete_incomplete", endpoint=self.name, exc_info=True)
                return

    async def _stop_loop(self) -> None:
        """End the loop within LOOP_STOP_S. A cancel alone is not enough: one that arrives while a library's
        `asyncio.wait_for` (Python 3.11) sees its inner call finish is swallowed, and the loop ran on, renewing its
        lease, forever. `_closing` ends the loop at its next turn and stops every fleet sync at once; the cancel
        is repeated until the loop ends; a tick stuck past the bound is left behind (it can no longer renew)."""
        self._closing = True
        self.ownership.retire()  # nor does the gateway's batch renew its lease
        loop, deadline = self._loop, time.monotonic() + LOOP_STOP_S
        if loop is asyncio.current_task():  # a stop from inside a tick: the loop ends when the tick returns
            return
        while loop is not None and not loop.done() and time.monotonic() < deadline:
            loop.cancel()
            await asyncio.wait([loop], timeout=DRAIN_CHECK_S)
        if loop is not None and not loop.done():
            log.error("endpoint_loop_stuck", endpoint=self.name, waited_s=LOOP_STOP_S)

    async def _leave_shared(self) -> None:
        deadline = self.clock() + self.spec.drain_seconds
        while self.in_flight and self.clock() < deadline:
            await asyncio.sleep(DRAIN_CHECK_S)
        await self._drains.stop(LOOP_STOP_S)  # a drain this owner ran: the next owner takes it over
        await self._resign()
        await self.provisioner.close()
        for member in list(self.members.values()):
            await self._forget(member)
        self._publish()

    async def _resign(self) -> None:
        try:
            await self.ownership.resign()
        except Exception:  # the shared state is gone: the lease and the report expire by themselves
            log.warning("endpoint_resign_failed", endpoint=self.name, exc_info=True)

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.tick()
                self._tick_failure.succeeded()
            except Exception as error:  # a provisioner's API error must not end the endpoint's loop
                self._tick_failure.failed(error)
            # a replica starting or requests waiting: look again soon (readiness is seen within 50 ms)
            busy = self.activator.waiting or any(not m.ready for m in self.members.values())
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the wait's result when a cancel comes
            # with a wake-up (a poke), swallowing the cancel; this loop then ran on and drain_and_stop, which
            # awaits it, never ended: a stopping gateway that never exited
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BUSY_TICK_S if busy else self.settings.tick_seconds):
                    await self._wake.wait()
            self._wake.clear()

    # ---- one tick ----

    async def tick(self) -> None:
        now = self.clock()
        busy = sum(r.in_flight for r in self.pool.replicas) + self.activator.waiting
        local = busy + self.activator.turned_away
        self._turned_away = max(self._turned_away, self.activator.turned_away)  # until published
        self.activator.turned_away = 0
        if self.ownership.due(now, local) and not self._closing:
            try:
                await self._sync_fleet(now, busy + self._turned_away)
                self._turned_away = 0
                if not self.ownership.owner:  # a follower reads the owner's replica list after each sync only
                    self._next_observe = -math.inf
                self._sync_failure.succeeded()
            except Exception as error:  # Redis or PostgreSQL away: serve on what is known; the lease lapses itself
                self._sync_failure.failed(error)
        owner = self.ownership.owner
        if not owner:  # not, or no longer, ours: a later lease starts from what the service says then
            self._adopted = self._looked = False
            if self._adopt_failed:  # that finding was the owner's: whoever owns it now looks again
                self._clear_adopt_failure()
        elif not self._adopted and now >= self._next_adopt and not self._closing:
            await self._adopt(now)
        if now >= self._next_observe and (self._adopted or not owner):
            try:
                observation = await self._look(now)
            except ProvisionerBackoff as backoff:
                self._next_observe = now + backoff.retry_in
                observation = None
            if observation is not None:
                self._looked = self._looked or self.ownership.owner
                await self._sync(observation, now)
                self._apply_draining()
        await self._poll(now)
        owner = self.ownership.owner and self._looked  # an owner acts only on what it has seen itself
        if owner:
            await self._time_out_starts(now)
        self.autoscaler.record(now, self.ownership.fleet_demand(local))
        if not self.provisioner.scalable:
            self.desired = len(self.members)
        elif owner and self.failure is None and not self.stopping:
            await self._scale(now)
        self.activator.replicas_starting(self._counts()[1] > 0)  # pumps
        self._publish()

    async def _sync_fleet(self, now: float, local: float) -> None:
        """Publish this gateway's demand, renew or take the lease, read the fleet's demand and marks."""
        in_flight = {m.replica_id: m.replica.in_flight for m in self.members.values()
                     if m.replica is not None and m.replica.in_flight}
        if self.failure is not None and not self._failure_shared and self.provisioner.shared:
            failure = Failure(self.failure_reason or "failed", self.failure)
            await self.ownership.fleet.mark_failed(self.ownership.endpoint, failure)
            self._failure_shared = True
        await self.ownership.sync(now, Report(local, in_flight, sorted(self.ownership.draining)))
        self._follow_fleet_failure()
        self._apply_draining()

    def _follow_fleet_failure(self) -> None:
        """A shared endpoint's failure as the fleet has it: another gateway's (or a former owner's) is taken
        over, one that a PATCH cleared elsewhere is cleared here."""
        if not self.provisioner.shared:
            return
        shared = self.ownership.failure
        if shared is not None and self.failure is None:
            self._failure_shared = True
            self._fail(shared.reason, shared.detail.removeprefix(f"{shared.reason}: "))
        elif shared is None and self.failure is not None and self._failure_shared:
            self._clear_failure()

    async def _adopt(self, now: float) -> None:
        """This gateway owns the endpoint and has not read the service since: start from what ECS says. Throttled:
        again after the provisioner's backoff. Refused (no such service, cluster or region; no permission): the
        endpoint fails with the platform's answer, and nothing is written."""
        try:
            await self.provisioner.open()
        except ProvisionerBackoff as backoff:
            self._next_adopt = now + backoff.retry_in
            return
        except Exception as error:
            self._next_adopt = now + ADOPT_RETRY_S
            if self.failure is None:
                self._adopt_failed = True
                self._fail(ADOPT_FAILED, _cause(error), stop_replicas=False)
            return
        if self._adopt_failed:
            self._clear_adopt_failure()
            if self.provisioner.shared:  # the fleet took this owner's finding over: it no longer holds
                await self.ownership.fleet.clear_failed(self.ownership.endpoint)
        self._adopted, self._next_observe = True, -math.inf
        if getattr(self.provisioner, "desired", None) == 0 and not self.members:
            # nothing asked for and nothing known: no task to list now (the steady pace looks later), which
            # halves what adopting a fleet of idle endpoints costs the ECS budget
            self._looked, self._next_observe = True, now + self.provisioner.observe_interval_s
        # the count it inherits stands for a stable window: this gateway's window may be young
        self._hold_until = now + self.settings.stable_window_seconds

    def _clear_adopt_failure(self) -> None:
        self._adopt_failed = False
        if self.failure is not None and self.failure_reason == ADOPT_FAILED:
            self._clear_failure()

    async def _look(self, now: float) -> Observation | None:
        """The owner asks the provisioner (and shares the answer); the others read the owner's answer."""
        shared = self.provisioner.shared
        if not shared or self.ownership.owner:
            self._next_observe = now + self.provisioner.observe_interval_s  # kept should the look fail
            observation = await self.provisioner.observe()
            # the pace this answer calls for: a task it shows starting is looked at again soon, not at the steady
            # pace the look before it set (200 s at 100 ECS endpoints)
            self._next_observe = now + self.provisioner.observe_interval_s
            if shared:
                await self.ownership.share([(r.replica_id, r.url) for r in observation.replicas],
                                           getattr(self.provisioner, "desired", len(observation.replicas)))
            return observation
        self._next_observe = math.inf  # again after the next sync (busy: every fleet_sync_seconds; idle: on news)
        replicas = await self.ownership.shared()
        if replicas is None:
            return None
        self.desired = replicas.desired
        return Observation([ReplicaAddress(replica_id, url) for replica_id, url in replicas.replicas])

    def _apply_draining(self) -> None:
        """The fleet's draining marks: stop routing to those replicas; an owner drains what it does not yet."""
        for member in self.members.values():
            if member.replica is None or member.replica_id not in self.ownership.draining:
                continue
            if self.ownership.owner and not member.drained_here:
                self._begin_drain(member)
            else:
                member.replica.draining = True

    async def _scale(self, now: float) -> None:
        ready, starting = self._counts()
        spec = self.spec
        bounds = Bounds(spec.min_replicas, spec.max_replicas, spec.target_concurrency, spec.idle_seconds)
        decision = self.autoscaler.decide(now, bounds, ready, starting)
        self.desired = decision.desired
        actions = plan(decision.desired, ready, starting)
        if actions.start and now >= self._next_start and await self.ownership.fenced():
            log.info("endpoint_scale_up", endpoint=self.name, replicas=ready + starting, desired=decision.desired,
                     panicking=decision.panicking, stable=round(decision.stable_average, 2),
                     panic=round(decision.panic_average, 2))
            # absolute: the decision plus the drained replicas the service still counts until they stop
            target = decision.desired + sum(1 for m in self.members.values() if m.draining)
            try:
                await self.provisioner.add(actions.start, target=target)
            except (ProvisionerBackoff, FenceLost):
                return  # throttled, or no longer ours: the next tick decides again
            metrics.STARTS.labels(self.name).inc(actions.start)
            self._next_observe = -math.inf  # see the new replicas before deciding again
        if actions.remove and now >= self._hold_until:
            idle_first = sorted((m for m in self.members.values() if m.ready and not m.draining),
                                key=lambda m: m.replica.in_flight + self.ownership.in_flight(m.replica_id))
            if self.provisioner.shared:  # only a replica with no request anywhere in the fleet
                idle_first = [m for m in idle_first if not m.replica.in_flight
                              and not self.ownership.in_flight(m.replica_id)]
            if idle_first:
                log.info("endpoint_scale_down", endpoint=self.name, replicas=ready + starting,
                         desired=decision.desired)
            for member in idle_first[:actions.remove]:
                self._begin_drain(member)

    def _counts(self) -> tuple[int, int]:
        live = [m for m in self.members.values() if not m.draining]
        ready = sum(1 for m in live if m.ready)
        return ready, len(live) - ready

    # ---- what the provisioner runs ----

    async def _sync(self, observation: Observation, now: float) -> None:
        seen = set()
        for address in observation.replicas:
            seen.add(address.replica_id)
            member = self.members.setdefault(address.replica_id, Member(address.replica_id, now))
            if address.url is not None and member.replica is None:
                member.replica = self.router.add_replica(self.name, address.url, address.replica_id)
        exited = {e.replica_id for e in observation.exits}
        for member in [m for m in self.members.values() if m.replica_id not in seen | exited]:
            await self._forget(member)  # gone without an exit report (an ECS placeholder filled)
        for exit in observation.exits:  # one that died before it was ever seen counts too
            member = self.members.get(exit.replica_id) or Member(exit.replica_id, now)
            await self._forget(member)
            self._exited(member, exit)

    def _exited(self, member: Member, exit: ReplicaExit) -> None:
        if member.draining or self.stopping:
            return
        if member.ready:
            log.warning("replica_lost", endpoint=self.name, replica=member.replica_id, reason=exit.reason)
            return
        if exit.load_failed:
            self._fail("weights failed to load", exit.reason)
            return
        self._start_failed(member, exit.reason)

    def _start_failed(self, member: Member, reason: str) -> None:
        self.start_streak += 1
        log.warning("replica_start_failed", endpoint=self.name, replica=member.replica_id, streak=self.start_streak,
                    reason=reason)
        if self.start_streak >= self.settings.start_failures:
            self._fail("crash loop", f"{self.start_streak} replicas in a row exited while starting; last: {reason}")
        else:
            self._next_start = self.clock() + min(30.0, 0.5 * 2 ** (self.start_streak - 1))

    async def _poll(self, now: float) -> None:
        due = [m for m in self.members.values() if m.replica is not None and
               (not m.ready or now - m.last_poll >= self.settings.health_interval_seconds)]
        for member in due:
            member.last_poll = now
        await asyncio.gather(*(m.replica.poll() for m in due))
        for member in due:
            if member.ready and not member.started:
                member.started = True
                took = self.clock() - member.since
                self.expected_start_s = took if self._starts_seen == 0 else 0.7 * self.expected_start_s + 0.3 * took
                self._starts_seen += 1
                self.start_streak = 0
                log.info("replica_ready", endpoint=self.name, replica=member.replica_id, start_s=round(took, 3))
        for member in due:
            down = member.ready and not member.replica.healthy and not member.draining
            member.down_since = (now if member.down_since is None else member.down_since) if down else None
        if (self.ownership.owner or not self.provisioner.shared) and any(
                m.down_since is not None and now - m.down_since < LOST_LOOK_FOR_S for m in due):
            # a serving replica went down: its task may have stopped and be replaced by the platform, which the
            # steady pace (200 s at 100 ECS endpoints) would see late. Looked at every LOST_LOOK_S for a while
            # only: a replacement once listed is paced by the provisioner, and a hung task's looks stay bounded
            self._next_observe = min(self._next_observe, now + LOST_LOOK_S)

    async def _time_out_starts(self, now: float) -> None:
        ecs = isinstance(self.spec.provisioner, EcsProvisioning)
        limit = self.settings.ecs_start_timeout_seconds if ecs else self.settings.start_timeout_seconds
        for member in [m for m in self.members.values() if not m.ready and now - m.since > limit]:
            what = "no capacity: it got no address" if member.replica is None else "its worker never reported ready"
            await self._remove(member)
            self._start_failed(member, f"{what} in {limit:g} s")

    # ---- removal ----

    def _begin_drain(self, member: Member) -> None:
        member.replica.draining = True
        member.drained_here = True
        self._drains.spawn(self._drain(member), name=f"drain {member.replica_id}")

    async def _drain(self, member: Member) -> None:
        replica, shared = member.replica, self.provisioner.shared
        deadline = self.clock() + self.spec.drain_seconds
        if shared and self.ownership.owner:
            await self.ownership.mark_draining(member.replica_id)  # every gateway stops routing to it
        while self.clock() < deadline:
            if not replica.in_flight and (not shared or self.ownership.quiet(member.replica_id)):
                break
            if shared and not self.ownership.owner:
                return  # the lease moved: the new owner finishes this drain
            await asyncio.sleep(DRAIN_CHECK_S)
        else:
            log.warning("drain_timed_out", endpoint=self.name, replica=member.replica_id, in_flight=replica.in_flight)
        while self.members.get(member.replica_id) is member:
            try:
                await self._remove(member)
            except ProvisionerBackoff as backoff:
                await asyncio.sleep(backoff.retry_in)
        self.poke()

    async def _remove(self, member: Member) -> None:
        if not await self.ownership.fenced():
            await self._forget(member)  # no longer ours to stop: the owner's list brings it back if it lives
            return
        with contextlib.suppress(FenceLost):  # lost just before the write: the same
            await self.provisioner.remove(member.replica_id)  # first: throttled, the replica stays a member
        await self._forget(member)

    async def _forget(self, member: Member) -> None:
        if self.members.get(member.replica_id) is member:
            del self.members[member.replica_id]
        if member.replica is not None:
            await self.router.remove_replica(self.name, member.replica)

    def _fail(self, reason: str, detail: str, *, stop_replicas: bool = True) -> None:
        """`reason`, a fixed phrase, is all a tenant learns (a 503's `endpoint_reason`, `GET /v1/endpoints`);
        `detail` (a worker's last line: paths, an exception) stays with the operator: the log, the admin API,
        `/health` for an admin key."""
        self.failure, self.failure_reason = f"{reason}: {detail}", reason
        log.error("endpoint_failed", endpoint=self.name, reason=self.failure)
        self.ownership.sync_soon()  # a shared endpoint's failure reaches the fleet at the next tick
        self.activator.reject_all("endpoint_failed", "the endpoint failed")
        for member in list(self.members.values()) if stop_replicas else []:
            self._drains.spawn(self._remove(member), name=f"remove {member.replica_id}")
        self.on_failed(self)

    # ---- what it looks like ----

    @property
    def state(self) -> str:
        if self.failure is not None:
            return "failed"
        if self.stopping:
            return "draining"
        if any(r.healthy and not r.draining for r in self.pool.replicas):
            return "ready"
        if any(not m.draining for m in self.members.values()) or self.desired > 0:
            return "starting"
        return "scaled_to_zero"

    def availability(self) -> Availability:
        state = self.state
        if state == "failed":
            return Availability(state, self.failure_reason, FAILED_RETRY_AFTER_S)
        if state in ("starting", "scaled_to_zero"):
            starts = [self.clock() - m.since for m in self.members.values() if not m.ready]
            return Availability(state, None, max(1.0, self.expected_start_s - max(starts, default=0.0)))
        return Availability(state, None, 1.0)

    def status(self) -> EndpointStatus:
        ready, starting = self._counts()
        draining = sum(1 for m in self.members.values() if m.draining)
        return EndpointStatus(name=self.name, state=self.state, reason=self.failure_reason, detail=self.failure,
                              replicas=ReplicaCounts(ready, starting, draining), desired_replicas=self.desired,
                              in_flight=self.in_flight, waiting=self.activator.waiting,
                              spec=self.spec)

    def _publish(self) -> None:
        status = self.status()
        metrics.set_state(self.name, status.state)
        for phase in metrics.PHASES:
            metrics.REPLICAS.labels(self.name, phase).set(getattr(status.replicas, phase))
        metrics.DESIRED.labels(self.name).set(status.desired_replicas)


def _cause(error: Exception) -> str:
    """The platform's answer in one line (a botocore error names its code and message)."""
    return " ".join(str(error).split())[:500] or type(error).__name__
