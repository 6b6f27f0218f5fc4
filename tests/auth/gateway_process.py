"""A stand-in gateway process for the cross-process test: its own AuthService on the shared database.

Usage: python -m tests.auth.gateway_process URL PEPPER_HEX KEY
Prints "ready" once the key is cached, then polls it every 10 ms and prints "<code> <monotonic time>" at the first
refusal, the time being when the last check that still accepted the key began (CLOCK_MONOTONIC is system-wide on
Linux, so the parent can compare): a check that began later than the promise allows must not have accepted it,
however late a loaded machine let this process see the refusal.
"""

from __future__ import annotations

import asyncio
import sys
import time

import structlog

from auth import AuthError, AuthService


async def main(url: str, pepper_hex: str, key: str) -> None:
    service = await AuthService.open(url, bytes.fromhex(pepper_hex))
    try:
        await service.authenticate(f"Bearer {key}", None, "gw")
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        last_accepted = time.monotonic()
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                await service.authenticate(f"Bearer {key}", None, "gw")
            except AuthError as exc:
                print(f"{exc.code} {last_accepted}", flush=True)
                return
            last_accepted = began
            await asyncio.sleep(0.01)
        print("timeout 0", flush=True)
    finally:
        await service.close()


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout is the protocol
    asyncio.run(main(*sys.argv[1:4]))
