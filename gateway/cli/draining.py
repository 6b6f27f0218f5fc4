"""SIGTERM in two steps, so that a shutdown cuts no stream and refuses nothing silently.

uvicorn alone would close its listening socket at once: a client would meet a refused connection rather than
an answer. Here the first SIGTERM keeps the gateway listening and answering while it drains:
1. every endpoint stops accepting: a new request gets a 503 with Retry-After in its dialect's envelope, the
   endpoint's state `draining` (and `/health` answers 503, so a load balancer takes this gateway out), while
   the requests already on a replica go on;
2. once none is left on a replica (or `drain_s` has passed), uvicorn's own graceful shutdown runs: the
   listening socket closes, open responses finish, the lifespan stops the replicas and drains the usage log.
The process then exits 0: the drain completed. A second SIGTERM, or SIGINT, is uvicorn's usual exit.

A SIGTERM while the lifespan still starts (an orchestrator stopping a task it just launched: a deploy rolled back,
a scale-in) is an ordinary stop too, not a kill: nothing is served yet, so nothing needs draining; start-up
finishes, the lifespan closes what it opened, and the process exits 0. uvicorn alone would re-raise the signal once
shut down and die of it (-15), which reads as a crash in ECS's and systemd's records.

The server also freezes the heap once start-up is over (`startup`): the garbage collector's pauses under load.
"""

from __future__ import annotations

import asyncio
import signal
from types import FrameType

import structlog
import uvicorn
from litestar import Litestar

from common.long_lived import freeze_what_lives_on
from gateway.endpoints.service import Endpoints

log = structlog.get_logger("gateway")
DRAIN_CHECK_S = 0.05


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Litestar, drain_s: float):
        super().__init__(config)
        self.gateway_app = app
        self.drain_s = drain_s
        self._drain_started = False
        self._drain: asyncio.Task | None = None  # held: a task nobody references may be collected

    async def startup(self, sockets: list | None = None) -> None:
        await super().startup(sockets=sockets)
        # after the lifespan, not before: frozen before it only, the collector still walked what the lifespan opened
        # (stores, pools, caches): pauses of several ms, several times a second under load
        freeze_what_lives_on()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        services = getattr(self.gateway_app.state, "services", None)
        if sig == signal.SIGTERM and services is None and not self.should_exit:
            self.should_exit = True  # during start-up: stop once started, and exit 0 (not recorded for re-raising)
            return
        if sig != signal.SIGTERM or self._drain_started or self.should_exit or services is None:
            super().handle_exit(sig, frame)
            return
        self._drain_started = True
        # a signal handler may run in the middle of the loop's own code: hand the loop the work the safe way
        asyncio.get_event_loop().call_soon_threadsafe(self._start_drain, services.endpoints)

    def _start_drain(self, endpoints: Endpoints) -> None:
        self._drain = asyncio.create_task(self._drain_then_exit(endpoints))

    async def _drain_then_exit(self, endpoints: Endpoints) -> None:
        endpoints.stop_accepting()
        log.info("gateway_draining", in_flight=endpoints.in_flight, drain_s=self.drain_s)
        deadline = asyncio.get_running_loop().time() + self.drain_s
        while endpoints.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(DRAIN_CHECK_S)
        if endpoints.in_flight:
            log.warning("gateway_drain_timed_out", in_flight=endpoints.in_flight)
        self.should_exit = True
