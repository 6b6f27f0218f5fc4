"""The generation probe behind SGLang's `GET /health_generate`: 200 only when a one-token generation works.

The route is public, so its answer is cached: at most one real generation per `interval` seconds, whatever
the number of callers; callers that arrive while a probe runs wait for that probe's answer. A failed probe
is cached for the same interval (a broken worker is not retried by every caller).

The probe generates on the first endpoint through the worker client, on a replica free now: it never waits
for one and never wakes a scaled-to-zero endpoint (a load balancer polling a public route must neither keep
an endpoint awake nor start one), so an endpoint with no ready replica is unhealthy at once."""

from __future__ import annotations

import asyncio
import secrets
import time

import structlog

from common.protocol import Done, GenerateRequest, SamplingParams
from gateway.errors import NotFound
from gateway.metrics import HEALTH_PROBES
from gateway.serving.worker_client import WorkerClient

log = structlog.get_logger(__name__)


class GenerationProbe:
    def __init__(self, workers: WorkerClient, interval: float) -> None:
        self._workers = workers
        self.interval = interval
        self._answer: tuple[float, bool] | None = None  # (monotonic time it was taken, healthy)
        self._running: asyncio.Task[bool] | None = None

    async def healthy(self) -> bool:
        answer = self._answer
        if answer is not None and time.monotonic() - answer[0] < self.interval:
            return answer[1]
        if self._running is None:
            self._running = asyncio.get_running_loop().create_task(self._probe())
            self._running.add_done_callback(self._finished)
        # shielded: a caller that leaves does not cancel the probe the others wait for
        return await asyncio.shield(self._running)

    def _finished(self, task: asyncio.Task[bool]) -> None:
        healthy = not task.cancelled() and task.exception() is None and task.result()
        self._answer = (time.monotonic(), healthy)
        self._running = None

    async def _probe(self) -> bool:
        healthy = False
        try:
            endpoint = next(iter(self._workers.endpoints.controllers.values()), None)
            if endpoint is None:
                raise NotFound("no endpoint is served")
            probe = GenerateRequest(request_id=f"health-generate-{secrets.token_hex(8)}", model=endpoint.name,
                                    prompt_ids=[0], params=SamplingParams(max_tokens=1, temperature=0.0))
            lease = await endpoint.activator.acquire(None)  # a free replica or none: the probe never wakes one
            async for event in self._workers.stream(endpoint, lease, probe, None):  # a worker's Error raises
                healthy = healthy or isinstance(event, Done)
        except Exception as error:  # noqa: BLE001 - whatever went wrong, generation does not work: 503, not 500
            log.warning("health_generate_failed", error=str(error), kind=type(error).__name__)
        HEALTH_PROBES.labels("ok" if healthy else "failed").inc()
        return healthy

    async def close(self) -> None:
        if self._running is not None:
            self._running.cancel()
