"""The 90-day hourly overview of one large team, as a user gets it: Chromium (Playwright, /usr/bin/chromium)
loading `/dashboard/overview` by the hour over 90 days of one team's 400,000 records (bench/dashboard.py's
generator, all in one team) from a gateway on SQLite. The targets (issue 44): the page under 1 MB and drawn in
under 2 s.

    .venv/bin/python bench/dashboard_hourly.py [--rows N] [--runs R] [--sqlite-file DIR]

For each of R loads after a warm one it measures the page's HTML as sent (bytes on the wire, gzipped, and
decoded), every other response the page fetched besides static files, the elements in the document, and the
time from navigation to every chart drawn on its canvas (bench/dashboard_pages.py's test), with the gateway
process's CPU time for the load. It prints the median and the spread, and whether each target is met. No peer
runs here (see bench/dashboard_pages.py's docstring): the targets are absolute, the figures ours only.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog
from playwright.async_api import async_playwright

from auth.models import TeamRecord
from auth.store import open_store as open_auth_store
from bench.dashboard import START, build
from bench.dashboard_pages import ADMIN_KEY, CHROMIUM, CHROMIUM_ARGS, DATABASE, DRAWN, LOAD, WINDOW, cpu_ms, spread
from testkit.servers import free_port, wait_for_port

TEAM = "team_big"
MAX_BYTES = 1_000_000
MAX_DRAW_MS = 2000.0
# the document's own size and every non-static response it fetched (htmx fragments, JSON), as Chromium saw them
SIZES = """() => { const n = performance.getEntriesByType("navigation")[0];
    const fetched = performance.getEntriesByType("resource").filter(r => !r.name.includes("/static/"));
    return [n.transferSize, n.encodedBodySize, n.decodedBodySize,
            fetched.reduce((s, r) => s + r.decodedBodySize, 0), document.getElementsByTagName("*").length]; }"""


# the page's own work after parsing (dashboard.js's `timed`): numbers localized, charts drawn; and the parse itself
WORK = """() => { const m = Object.fromEntries(performance.getEntriesByType("measure").map(e => [e.name, e.duration]));
    const n = performance.getEntriesByType("navigation")[0];
    return [n.domInteractive - n.responseEnd, m["sluice:numbers"] || 0, m["sluice:charts"] || 0]; }"""


async def prepare(data_dir: Path, rows: int) -> None:
    url = f"sqlite:///{data_dir / DATABASE}"
    if not (data_dir / DATABASE).exists():
        print(f"building {rows:,} records of one team ...", flush=True)
        seconds, _ = await build(url, rows, teams=[TEAM])
        print(f"  built in {seconds:.1f} s", flush=True)
    auth = await open_auth_store(url)
    try:
        if await auth.get_team(TEAM) is None:
            await auth.insert_team(TeamRecord(TEAM, TEAM, None, START))
    finally:
        await auth.close()


async def measure(base: str, gateway_pid: int, runs: int) -> bool:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context(viewport={"width": 1440, "height": 900}, bypass_csp=True)
        page = await context.new_page()
        await page.goto(f"{base}/dashboard/login")
        await page.fill("#api_key", ADMIN_KEY)
        await page.click("button[type=submit]")
        url = f"{base}/dashboard/overview?team_id={TEAM}&{WINDOW}&granularity=hour"
        drawn, cpu, sizes, first_byte, ready, parse, numbers, charts = [], [], [], [], [], [], [], []
        for run in range(runs + 1):  # the first load warms the caches
            cpu_before = cpu_ms(gateway_pid)
            started = time.perf_counter()
            response = await page.goto(url)
            assert response.status == 200, response.status
            await page.wait_for_function(DRAWN, timeout=120_000)
            total = (time.perf_counter() - started) * 1000
            if run:
                drawn.append(total), cpu.append(cpu_ms(gateway_pid) - cpu_before)
                sizes.append(await page.evaluate(SIZES))
                byte, dom = await page.evaluate(LOAD)
                first_byte.append(byte), ready.append(dom)
                parsed, localized, plotted = await page.evaluate(WORK)
                parse.append(parsed), numbers.append(localized), charts.append(plotted)
        await browser.close()
    wire, encoded, decoded, fetched, elements = sizes[-1]
    print(f"90 days by the hour, one team of {args_rows:,} records:")
    print(f"  HTML {decoded:,} bytes ({encoded:,} as sent, {wire:,} on the wire); other responses {fetched:,} bytes; "
          f"{elements:,} elements")
    print(f"  first byte {spread(first_byte)}   DOM ready {spread(ready)}   charts drawn {spread(drawn)}")
    print(f"  in Chromium: HTML parsed after the last byte {spread(parse)}   numbers localized {spread(numbers)}   "
          f"charts drawn (uPlot) {spread(charts)}")
    print(f"  gateway CPU for the page {spread(cpu)}")
    size_ok = decoded + fetched < MAX_BYTES
    draw_ok = sorted(drawn)[len(drawn) // 2] < MAX_DRAW_MS
    print(f"  under 1 MB: {'yes' if size_ok else 'NO'}   drawn in under 2 s (median): {'yes' if draw_ok else 'NO'}")
    return size_ok and draw_ok


args_rows = 0


def main() -> None:
    global args_rows
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sqlite-file", type=Path, help="keep the database here (a data dir) and reuse it")
    args = parser.parse_args()
    args_rows = args.rows
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory(prefix="sluice-bench-hourly-") as tmp:
        data_dir = args.sqlite_file or Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(prepare(data_dir, args.rows))
        port = free_port()
        gateway = subprocess.Popen([sys.executable, str(Path(__file__).with_name("dashboard_pages.py")), "--serve",
                                    str(data_dir), str(port)], stdout=subprocess.DEVNULL)
        try:
            wait_for_port(port, timeout=60)
            met = asyncio.run(measure(f"http://127.0.0.1:{port}", gateway.pid, args.runs))
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
