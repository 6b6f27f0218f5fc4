"""Fixtures shared by more than one suite: real database and cache servers for the session, both auth stores (the
auth and endpoint suites), `sluice serve` on the default model (compat, e2e), the default model's tokenizer and the
dashboard's gateway served on loopback (the dashboard and security suites)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from hypothesis import settings

from testkit.databases import fresh_database
from testkit.servers import postgres_server, redis_server
from testkit.sluice import GRAMMAR_COMPILE_LIMIT_S, MODEL, default_model_dir, running_sluice
from tests import cpu_report
from tests.file_order import longest_first, read_weights
from tests.gateway.dashboard.served import served_gateway, settings_in

# `make test` loads "ci": every property test (hypothesis, schemathesis) replays the examples its own seed
# derives (derandomized) and keeps no example database, so the verdict is the same on every run and every
# machine; a failure found once stays as an explicit `@example`. `make fuzz` loads "fuzz": a fresh seed per
# round (`--hypothesis-seed`, printed by the Makefile), SLUICE_FUZZ_SCALE times the examples. Neither has a
# deadline: Hypothesis's 200 ms per example is a wall-clock assertion a loaded machine fails (then "Flaky").
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("SLUICE_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the whole session; tests create their own databases or schemas."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis():
    """A real redis-server for the whole session; tests use distinct key prefixes or FLUSHDB."""
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def moto_url():
    """A moto server for the module's ECS tests, its tasks' states played by the tests (testkit/played_ecs.py)."""
    from testkit.local_aws import moto_server  # moto and boto3 only in the sessions that use them
    from testkit.played_ecs import manual_task_states

    with moto_server() as url:
        manual_task_states(url)
        yield url


@pytest.fixture
def aws(moto_url, monkeypatch):
    """(ECS client, network) of a fresh cluster and service in moto, with the test credentials set."""
    from testkit.played_ecs import ecs_service

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with ecs_service(moto_url) as (ecs, network):
        yield ecs, network


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request, tmp_path):
    """Both databases the gateway opens for auth and endpoints: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/auth.db"
        return
    async with fresh_database(request.getfixturevalue("postgres"), "auth") as url:
        yield url


@pytest.fixture(scope="session")
def sluice_on_smol(tmp_path_factory):
    """The real gateway + worker with the default model, shared by every module of a test process that uses it
    (compat, e2e: a model load each would cost minutes of CI), in the exact mode: these tests compare replies
    (streamed against whole, one SDK against another) that the CPU default (q4 or w8a8) may round differently as
    batches or prefill chunks differ (README, "The default compute path"). The modules make their own teams and
    keys for what they change; the rejection budget is wide, since their bad requests add up on the default key."""
    exact = ('rejections_per_minute = 100000\n'
             f'[[models]]\nname = "{MODEL}"\nquantization = "none"\ndtype = "float32"\n'
             f'grammar_compile_timeout_s = {GRAMMAR_COMPILE_LIMIT_S}\n')  # structured output: not about that limit
    with running_sluice(tmp_path_factory.mktemp("smol"), config=exact) as server:
        yield server


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The default model's tokenizer, as transformers loads it from the model's own directory (the cache holds
    other models' too: Gemma 3). Shared: a test that changes it changes a deep copy."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir())


@pytest.fixture
async def dashboard_server(tmp_path):
    """The gateway app served on loopback for the dashboard (tests/gateway/dashboard/served.py)."""
    async with served_gateway(settings_in(tmp_path)) as served:
        yield served


def pytest_configure(config):
    cpu_report.register(config)  # with SLUICE_TEST_CPU_REPORT set: CPU seconds per test file (tests/cpu_report.py)


def pytest_collection_modifyitems(items):
    """Longest files first, so the two test processes finish together (tests/file_order.py)."""
    items[:] = longest_first(items, read_weights())


def pytest_unconfigure(config):
    """A leaked non-daemon thread (an unclosed aiosqlite connection, say) would keep the interpreter
    from exiting and CI would hang until its time limit: name the threads and fail the run instead."""
    deadline = 10.0
    leaked = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    for thread in leaked:
        thread.join(timeout=deadline / max(1, len(leaked)))
    leaked = [t for t in leaked if t.is_alive()]
    if leaked:
        names = ", ".join(f"{t.name} ({getattr(t, '_target', None)})" for t in leaked)
        sys.stderr.write(f"\nleaked non-daemon threads kept the test process alive: {names}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(3)
