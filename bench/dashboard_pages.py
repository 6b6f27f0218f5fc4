"""The dashboard's overview as a user gets it: Chromium (Playwright, /usr/bin/chromium) loading the 90-day
overview of a team from a gateway over a large SQLite ledger (bench/dashboard.py's: by default 1,000,000
records over 50 teams and 90 days).

    .venv/bin/python bench/dashboard_pages.py [--rows N] [--runs R] [--sqlite-file F]

The gateway runs in its own process (this script with --serve) on the ledger's database; the admin key
signs in once. For the largest and the median team it prints, over R loads after a warm one, the median and
the spread (min..max) of: the first byte of the page (the server's work: the same queries as
`GET /admin/usage/overview`, then the template), the DOM ready, and everything drawn (every uPlot chart on
their canvases), with the gateway process's CPU time for the load (contention for shared cores inflates the
wall times, not that); beside them the same overview as JSON from the usage API, fetched by the same browser.

No peer runs here: LiteLLM's usage page needs its Next.js UI on its proxy with Prisma on PostgreSQL, and
Prisma downloads its engines from the internet at start, which this machine cannot reach. The figures
are ours only; the target is < 300 ms for the overview's queries (bench/dashboard.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog
import uvicorn
from playwright.async_api import async_playwright

from auth.models import TeamRecord
from auth.store import open_store as open_auth_store
from bench.dashboard import DAYS, START, build, team_names
from billing.filters import Selection
from billing.insights.ranking import team_ranking
from billing.store import open_store as open_usage_store
from gateway.config import Settings
from gateway.edge.app import create_app
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.servers import free_port, wait_for_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ADMIN_KEY = "bench-dashboard-admin-key-0123456789abcdef"
DATABASE = "sluice.db"  # the gateway's one SQLite file in its data dir (auth and ledger)
WINDOW = "range=custom&start=2025-01-01&end=2025-03-31"  # bench/dashboard.py's 90 days


def serve(data_dir: str, port: int) -> None:
    """The gateway on the bench's database; the model's address answers nothing (no page needs a worker)."""
    model = EndpointSpec(name="small", provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    settings = Settings(data_dir=data_dir, port=port, models=[model], log_format="console", admin_key=ADMIN_KEY)
    uvicorn.run(create_app(settings, supervise=False), host="127.0.0.1", port=port, log_level="warning")


async def prepare(data_dir: Path, rows: int) -> list[tuple[str, str, int]]:
    """The ledger (built unless there), auth teams under the ledger's team ids; (label, team, records) of the
    largest and the median team."""
    url = f"sqlite:///{data_dir / DATABASE}"
    if not (data_dir / DATABASE).exists():
        print(f"building {rows} records ...", flush=True)
        seconds, _ = await build(url, rows)
        print(f"  built in {seconds:.1f} s", flush=True)
    auth = await open_auth_store(url)
    try:
        for team in team_names():
            if await auth.get_team(team) is None:
                await auth.insert_team(TeamRecord(team, team, None, START))
    finally:
        await auth.close()
    usage = await open_usage_store(url)
    try:
        counts = {r.key: r.requests for r in await team_ranking(usage, Selection(START, START + DAYS * 86400))}
    finally:
        await usage.close()
    by_size = sorted(counts, key=counts.get, reverse=True)
    return [(label, team, counts[team]) for label, team in (("largest", by_size[0]),
                                                            ("median", by_size[len(by_size) // 2]))]


def cpu_ms(pid: int) -> float:
    """CPU time (user + system) the process has used: the gateway's work, which waiting for a core shared
    with other programs does not inflate as it does the wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


LOAD = """() => { const n = performance.getEntriesByType("navigation")[0];
                 return [n.responseStart - n.startTime, n.domContentLoadedEventEnd - n.startTime]; }"""


FETCH_JSON = """async ([url, key]) => { const t = performance.now();
    const r = await fetch(url, {headers: {authorization: "Bearer " + key}});
    await r.json(); return performance.now() - t; }"""


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} ms ({min(values):.1f}..{max(values):.1f})"


# every chart on the page has its canvas (uPlot draws into one per chart)
DRAWN = "[...document.querySelectorAll('[data-chart]')].every(chart => chart.querySelector('canvas'))"


async def measure(base: str, gateway_pid: int, teams: list[tuple[str, str, int]], runs: int) -> None:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        # the dashboard's CSP forbids eval, which Playwright's wait_for_function predicate needs
        context = await browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
        page = await context.new_page()
        await page.goto(f"{base}/dashboard/login")
        await page.fill("#api_key", ADMIN_KEY)
        await page.click("button[type=submit]")
        for label, team, records in teams:
            for tz in ("UTC", "America/New_York"):
                url = f"{base}/dashboard/overview?team_id={team}&{WINDOW}&tz={tz}"
                api_url = f"/admin/usage/overview?team_id={team}&{WINDOW}&tz={tz}&granularity=day"
                first_byte, ready, drawn, api, cpu = [], [], [], [], []
                for run in range(runs + 1):  # the first load warms the caches
                    cpu_before = cpu_ms(gateway_pid)
                    started = time.perf_counter()
                    response = await page.goto(url)
                    assert response.status == 200, response.status
                    await page.wait_for_function(DRAWN)
                    total = (time.perf_counter() - started) * 1000
                    gateway_cpu = cpu_ms(gateway_pid) - cpu_before  # the page (the static files come from the cache)
                    byte, dom = await page.evaluate(LOAD)
                    json_ms = await page.evaluate(FETCH_JSON, [api_url, ADMIN_KEY])
                    if run:
                        first_byte.append(byte), ready.append(dom), drawn.append(total), api.append(json_ms)
                        cpu.append(gateway_cpu)
                print(f"  {label} team {team} ({records} records), 90 days daily, {tz}:")
                print(f"    first byte {spread(first_byte)}   DOM ready {spread(ready)}   "
                      f"charts drawn {spread(drawn)}", flush=True)
                print(f"    gateway CPU for the page {spread(cpu)}   usage API JSON {spread(api)}", flush=True)
        await browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sqlite-file", type=Path, help="keep the database here (a data dir) and reuse it")
    parser.add_argument("--verbose", action="store_true", help="show the gateway's access log")
    parser.add_argument("--serve", nargs=2, metavar=("DATA_DIR", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory(prefix="sluice-bench-pages-") as tmp:
        data_dir = args.sqlite_file or Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        teams = asyncio.run(prepare(data_dir, args.rows))
        port = free_port()
        gateway = subprocess.Popen([sys.executable, __file__, "--serve", str(data_dir), str(port)],
                                   stdout=None if args.verbose else subprocess.DEVNULL)  # its access log
        try:
            wait_for_port(port, timeout=60)
            asyncio.run(measure(f"http://127.0.0.1:{port}", gateway.pid, teams, args.runs))
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)


if __name__ == "__main__":
    main()
