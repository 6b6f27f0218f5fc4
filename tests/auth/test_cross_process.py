"""Revocation and expiry changes reach other gateway processes (own AuthService each) within 1 s: no check that
begins a second after the change returned accepts the key (measured by when checks began, not by when a loaded
machine let a process see its refusal)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from auth.admin import Actor
from auth.models import CreateKey, RotateKey
from tests.auth.helpers import PEPPER

ROOT = Path(__file__).resolve().parents[2]
ACTOR = Actor(id="test", source="test")


async def _gateways(store_url: str, key: str, count: int = 2) -> list[asyncio.subprocess.Process]:
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.auth.gateway_process", store_url, PEPPER.hex(), key, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL) for _ in range(count)]
    for proc in procs:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"ready", line
    return procs


async def _refusals(procs) -> list[tuple[str, float]]:
    seen = []
    for proc in procs:
        code, at = (await asyncio.wait_for(proc.stdout.readline(), 40)).decode().split()
        await proc.wait()
        seen.append((code, float(at)))
    return seen


async def test_revocation_reaches_two_other_processes_within_a_second(service, store_url):
    team_id = (await service.bootstrap(None)).default_team_id
    key = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team_id))
    procs = await _gateways(store_url, key.key)
    await service.admin.revoke_key(ACTOR, key.id)
    done = time.monotonic()
    for code, at in await _refusals(procs):
        print(f"{code}; the last check that accepted the key began {at - done:.3f} s after the change")
        assert code == "revoked_api_key"
        assert at - done < 1.0, f"accepted {at - done:.3f} s after the change"


async def test_rotation_without_grace_reaches_other_processes_within_a_second(service, store_url):
    team_id = (await service.bootstrap(None)).default_team_id
    key = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team_id))
    procs = await _gateways(store_url, key.key)
    await service.admin.rotate_key(ACTOR, key.id, RotateKey(grace_seconds=0))
    done = time.monotonic()
    for code, at in await _refusals(procs):
        print(f"{code}; the last check that accepted the key began {at - done:.3f} s after the change")
        assert code == "expired_api_key"
        assert at - done < 1.0, f"accepted {at - done:.3f} s after the change"
