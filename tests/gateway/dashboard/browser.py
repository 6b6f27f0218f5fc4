"""Debian's Chromium driven by Playwright, for the dashboard tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# every launch, navigation and wait of a test: Playwright's 30 s is within reach of a page load on a loaded
# machine, and no dashboard test is about how fast a page comes
WAIT_MS = 180_000


@contextlib.asynccontextmanager
async def chromium_page(**context_options) -> AsyncIterator:
    """A page of a fresh Chromium context (1280x900 unless told)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=WAIT_MS)
        context = await browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **context_options})
        context.set_default_timeout(WAIT_MS)
        try:
            yield await context.new_page()
        finally:
            await context.close()
            await browser.close()
