"""Replicas of one model and the choice among them: healthy first, then least loaded.

A replica takes requests only while its worker reports ready (active health, `/load` polling), it is
not draining (chosen for removal: it finishes what it has and takes nothing new), and it is not
ejected (passive health: a request just failed on it, so it sits out a backoff period).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgspec
import structlog

from common.protocol import WORKER_SECRET_ENV, WORKER_SECRET_HEADER, ModelInfo, WorkerLoad
from gateway.replicas.transport import WorkerConnectionError, WorkerHTTP, WorkerTimeout
from gateway.replicas.trust import worker_secret
from gateway.replicas.worker_metrics import WORKERS

log = structlog.get_logger(__name__)
# polls in a row that may fail by timing out before a replica counts as down: one slow answer from a worker
# busy streaming (or from a gateway loop busy relaying) is not an outage; a refused connection is at once
MISSED_POLLS_TOLERATED = 2
MAX_EJECTION_S = 60.0
DEFAULT_READ_TIMEOUT_S = 840.0  # Settings.request_timeout_s's default
POLL_TIMEOUT_S = 2.0


@dataclass(eq=False)
class Replica:
    url: str
    # the one client of every call to this worker, polls included (gateway/replicas/transport.py); None: made
    # from `url` with the worker secret
    worker: WorkerHTTP = None  # type: ignore[assignment]
    healthy: bool = False
    load: WorkerLoad | None = None
    info: ModelInfo | None = None
    in_flight: int = 0  # requests this gateway has open on it, between two polls
    replica_id: str = ""  # the provisioner's name for it (worker id, ECS task ARN)
    ever_ready: bool = False  # false while the replica is starting
    draining: bool = False
    ejected_until: float = 0.0  # time.monotonic() until which it takes no new request
    ejections: int = 0  # failures in a row, each doubling the time it sits out
    refuses_secret: bool = False  # it answered 401: its SLUICE_WORKER_SECRET is not ours
    missed_polls: int = 0  # polls in a row that timed out

    def __post_init__(self) -> None:
        if self.worker is None:
            self.worker = WorkerHTTP(self.url, {WORKER_SECRET_HEADER: worker_secret()}, DEFAULT_READ_TIMEOUT_S)

    @property
    def pressure(self) -> int:
        load = self.load
        return self.in_flight + (load.queued + load.running_rows if load else 0)

    def available(self, now: float) -> bool:
        return self.healthy and not self.draining and now >= self.ejected_until

    def eject(self, now: float, base_seconds: float) -> float:
        """Passive health: a request failed here. Returns how long the replica sits out."""
        self.ejections += 1
        seconds = min(MAX_EJECTION_S, base_seconds * 2 ** (self.ejections - 1))
        self.ejected_until = now + seconds
        log.warning("replica_ejected", url=self.url, seconds=seconds)
        return seconds

    def served(self) -> None:
        """A request went through: the ejection backoff starts over."""
        self.ejections = 0

    async def get(self, path: str, timeout: float = POLL_TIMEOUT_S) -> tuple[int, bytes]:
        """`GET path` on this worker: its status and body (WorkerConnectionError when it cannot be heard)."""
        async with self.worker.get(path, timeout) as response:
            return response.status_code, await response.aread()

    async def poll(self) -> None:
        try:
            status, body = await self.get("/load")
            if status == 401 and not self.refuses_secret:  # said once, not at every poll
                log.error("replica_refuses_worker_secret", url=self.url,
                          fix=f"give the gateway and this worker the same {WORKER_SECRET_ENV}")
            self.refuses_secret = status == 401
            if status != 200:
                raise WorkerConnectionError(f"GET /load answered {status}")
            self.load = msgspec.json.decode(body, type=WorkerLoad)
            if self.info is None:
                status, body = await self.get("/info")
                if status != 200:
                    raise WorkerConnectionError(f"GET /info answered {status}")
                self.info = msgspec.json.decode(body, type=ModelInfo)
            became = not self.healthy and self.load.ready
            self.healthy = self.load.ready
            self.missed_polls = 0
            self.ever_ready = self.ever_ready or self.healthy
            if became:
                log.info("replica_ready", url=self.url)
        except WorkerTimeout:
            self.missed_polls += 1
            if self.missed_polls > MISSED_POLLS_TOLERATED:
                self._down()
        except (WorkerConnectionError, msgspec.DecodeError):
            self._down()

    def _down(self) -> None:
        if self.healthy:
            log.warning("replica_unhealthy", url=self.url)
        self.healthy = False
        self.info = None


@dataclass(eq=False)
class ModelPool:
    name: str
    replicas: list[Replica] = field(default_factory=list)
    _described: ModelInfo | None = None

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def info(self) -> ModelInfo | None:
        found = next((r.info for r in self.replicas if r.healthy and r.info), None)
        if found is not None:
            self._described = found
        return found

    def described(self) -> ModelInfo | None:
        """The info of a ready replica, else the last one seen (a model scaled to zero keeps its context and
        chat template): what admission bounds a request's tokens with."""
        return self.info() or self._described

    def candidates(self) -> list[Replica]:
        """Replicas that take requests now, least loaded first (the order the proxy tries them in)."""
        now = time.monotonic()
        return sorted((r for r in self.replicas if r.available(now)), key=lambda r: r.pressure)


class ReplicaRouter:
    """Model name -> pool. Each endpoint's controller polls its own replicas (gateway/endpoints/controller.py)."""

    def __init__(self, read_timeout: float = DEFAULT_READ_TIMEOUT_S):
        self.pools: dict[str, ModelPool] = {}
        self.read_timeout = read_timeout  # settings.request_timeout_s: no read outlives the concurrency lease
        WORKERS.watch(self)  # its replicas' engine series reach /metrics

    def add_replica(self, model: str, url: str, replica_id: str = "") -> Replica:
        worker = WorkerHTTP(url, {WORKER_SECRET_HEADER: worker_secret()}, self.read_timeout)
        replica = Replica(url, worker, replica_id=replica_id)
        self.ensure_pool(model).replicas.append(replica)
        return replica

    async def remove_replica(self, model: str, replica: Replica) -> None:
        """Forget a replica that is gone (stopped, or its process exited) and close its connections."""
        pool = self.pools.get(model)
        if pool is not None and replica in pool.replicas:
            pool.replicas.remove(replica)
        await replica.worker.aclose()

    def ensure_pool(self, model: str) -> ModelPool:
        """The model's pool, created empty if it has none yet (an endpoint scaled to zero)."""
        return self.pools.setdefault(model, ModelPool(model))

    def drop_pool(self, model: str) -> None:
        self.pools.pop(model, None)

    def pool(self, model: str) -> ModelPool | None:
        return self.pools.get(model)

    async def close(self) -> None:
        WORKERS.forget(self)
        for pool in self.pools.values():
            for replica in pool.replicas:
                await replica.worker.aclose()

