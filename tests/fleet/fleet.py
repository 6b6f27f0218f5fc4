"""Three real `sluice serve` gateways sharing PostgreSQL and Redis in front of one played ECS worker service (the
`fleet` fixture, conftest.py), and the load the fleet tests send through them.

ECS is played (testkit/played_ecs.py): each task the service runs is a protocol worker (`task_worker`: the tests
are about scaling, not tokens) whose streams last a few seconds; the gateways reach it through the test-only
`test_address_map` file and can be throttled through the test-only `test_throttle_file`.
"""


from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import redis as redis_client

from testkit.played_ecs import CLUSTER, PORT, SERVICE, PlayedEcs, TaskWorker, protocol_task
from testkit.protocol_worker import MODEL, Reply, tokens
from testkit.sluice import SluiceServer, start_sluice

ADMIN_KEY = "fleet-test-admin-key-0123456789abcdef"
STREAM_WORDS, WORD_PAUSE_S = 12, 0.25  # each stream lasts about 3 s on its worker
OWNER_KEY = f"sluice:fleet:{{ecs:us-east-1:{CLUSTER}:{SERVICE}}}:owner"  # keyed by the ECS service
WAIT_S = 90  # the longest any condition is waited for (a hang fails; two shared cores)
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def ecs_endpoint_toml(name: str, service: str, moto_url: str, *, model: str = "", provisioner: str = "") -> str:
    """A `[[models]]` entry of `sluice serve`'s config: an ECS endpoint at zero on the played cluster (moto);
    `model` and `provisioner`: more lines of each table."""
    return (f'[[models]]\nname = "{name}"\nmin_replicas = 0\nmax_replicas = 1\n{model}\n'
            f'[models.provisioner]\nkind = "ecs"\ncluster = "{CLUSTER}"\nservice = "{service}"\n'
            f'region = "us-east-1"\nendpoint_url = "{moto_url}"\nport = {PORT}\n{provisioner}\n')


def until(condition: Callable[[], object], timeout: float = WAIT_S, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not hold within {timeout} s")
        time.sleep(0.05)
    return value


def task_worker(task: dict) -> TaskWorker:
    """What the played agent runs for a task: a protocol worker answering every request with a slow stream."""
    return protocol_task(task, [Reply(tokens(" ".join(["w"] * STREAM_WORDS)), pause_s=WORD_PAUSE_S)])


@dataclass
class Fleet:
    config: str
    root: Path
    played: PlayedEcs
    redis: redis_client.Redis
    throttle_file: Path
    gateways: list[SluiceServer | None] = field(default_factory=lambda: [None, None, None])
    api_key: str = ""
    stopped: list[tuple[int, SluiceServer]] = field(default_factory=list)

    def start(self, *indexes: int) -> None:
        env = {**AWS_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY, "SLUICE_KEY_PEPPER": "fleet-test-pepper"}
        for index in indexes:
            self.gateways[index] = start_sluice(self.root / f"gateway-{index}", config=self.config, env=env,
                                                wait=False)
        for index in indexes:
            self.gateways[index].wait_healthy(timeout=WAIT_S)

    def stop(self, index: int, sig: int = signal.SIGTERM) -> int:
        gateway = self.gateways[index]
        code = gateway.stop(sig, timeout=WAIT_S)
        self.stopped.append((index, gateway))
        return code

    def save_output(self) -> None:
        """Every gateway process's output, the stopped ones' too, beside the data dirs (a failure's post-mortem)."""
        runs = [*self.stopped, *((i, g) for i, g in enumerate(self.gateways) if g is not None)]
        for number, (index, gateway) in enumerate(runs):
            (self.root / f"gateway-{index}-run-{number}-pid-{gateway.process.pid}.out").write_text(gateway.output)

    def ensure_running(self) -> None:
        dead = [i for i, g in enumerate(self.gateways) if g is None or g.process.poll() is not None]
        if dead:
            self.start(*dead)

    def owner(self) -> int | None:
        """The index of the gateway holding the endpoint's lease (its id names its pid), or None."""
        held = self.redis.get(OWNER_KEY)
        if held is None:
            return None
        pid = int(held.decode().rsplit("|", 1)[0].rsplit("-", 2)[1])  # "<host>-<pid>-<random>|<token>"
        return next((i for i, g in enumerate(self.gateways) if g is not None and g.process.pid == pid), None)

    def desired(self) -> int:
        return self.played.ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]["desiredCount"]

    def settle(self) -> None:
        """Every gateway up and the service back at zero tasks (idle_seconds after the last request)."""
        self.ensure_running()
        until(lambda: self.desired() == 0 and not self.played.workers, WAIT_S, "the scale to zero")

    def streams(self, gateways: Callable[[], list[int]], count: int) -> Load:
        return Load(self, gateways, count)


@dataclass
class Outcome:
    gateway: int
    status: int
    complete: bool  # reached [DONE] with no error event
    error: str = ""


class Load:
    """`count` clients, each streaming one completion after another through the gateways `gateways()`
    names (round robin), until stopped. A 503 before the stream began (a gateway draining) is retried on the
    next gateway; a stream that began and did not reach [DONE] is a cut stream."""

    def __init__(self, fleet: Fleet, gateways: Callable[[], list[int]], count: int):
        self.fleet, self.gateways, self.count = fleet, gateways, count
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(count)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WAIT_S)

    @property
    def cut(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200 and not o.complete]

    @property
    def served(self) -> int:
        return sum(1 for o in self.outcomes if o.complete)

    def _client(self, number: int) -> None:
        turn = number
        with httpx.Client(timeout=httpx.Timeout(WAIT_S)) as client:
            while not self._stop.is_set():
                choices = self.gateways()
                index = choices[turn % len(choices)]
                turn += 1
                self.outcomes.append(self._stream(client, index))

    def _stream(self, client: httpx.Client, index: int) -> Outcome:
        gateway = self.fleet.gateways[index]
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 64, "stream": True}
        headers = {"authorization": f"Bearer {self.fleet.api_key}"}
        try:
            with client.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=headers) as response:
                if response.status_code != 200:
                    response.read()
                    time.sleep(0.2)
                    return Outcome(index, response.status_code, False, response.text[:200])
                done, error = False, ""
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data:") and '"error"' in line:
                        error = line
                return Outcome(index, 200, done and not error, error)
        except httpx.HTTPError as failure:
            return Outcome(index, 0, False, repr(failure))




async def cut_listeners(kind: str, database: str, redis_url: str) -> None:
    """Cut every listener's connection to the fleet's store (Redis pub/sub, PostgreSQL LISTEN): the next change's
    message reaches no gateway, only a later look finds it."""
    if kind == "redis":
        admin = redis_client.Redis.from_url(redis_url)
        admin.client_kill_filter(_type="pubsub")
        admin.close()
        return
    connection = await asyncpg.connect(database)
    try:
        await connection.execute("""SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                     WHERE datname = current_database() AND query LIKE 'LISTEN%'""")
    finally:
        await connection.close()
