"""A fleet's ECS bookkeeping: how fast a gateway with many ECS endpoints serves and adopts them, and what idle
endpoints cost Redis and the gateways' CPU. This tree against a baseline tree (`--baseline`, e.g. main's
checkout) in the same run.

    .venv/bin/python bench/fleet_start.py [--endpoints 100] [--gateways 10] [--idle-seconds 20]
                                          [--baseline /work/main] [--quick] [--idle-only]

ECS is moto's server on this machine with one service per endpoint (nothing runs: every endpoint is idle at
min_replicas 0); Redis a real redis-server. Two parts, each run for this tree and the baseline:

- start: one real `sluice serve` whose config declares `--endpoints` ECS endpoints, with the default fleet ECS
  budget (2 calls/s): seconds from the process's spawn to its first `/livez` 200, and until every endpoint's
  service was adopted (its `ecs_service_adopted` log line);
- idle: `--gateways` gateways (each its own process holding the gateway's `Endpoints` service with every
  endpoint, as `sluice serve` does) on one Redis; once every endpoint has an owner that has adopted its
  service, over `--idle-seconds`: Redis commands a second (INFO total_commands_processed) and each gateway
  process's CPU (% of one core). The idle part runs with a budget of 20 ECS calls/s so that adopting every
  endpoint takes seconds rather than minutes (the budget does not change the idle sync pace).

No assertions: other processes share the cores; read the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
CLUSTER, PORT = "sluice", 8100
WAIT_S = 900


def name(index: int) -> str:
    return f"bench/ep-{index:03d}"


def service(index: int) -> str:
    return f"svc-{index:03d}"


def provisioner(index: int, moto_url: str) -> dict:
    return {"kind": "ecs", "cluster": CLUSTER, "service": service(index), "region": "us-east-1",
            "endpoint_url": moto_url, "port": PORT}


def config_toml(count: int, moto_url: str, redis_url: str) -> str:
    parts = [f'redis_url = "{redis_url}"\n\n[scaling]\nstandby_worker = false\n']
    for index in range(count):
        table = provisioner(index, moto_url)
        fields = "".join(f'{k} = {v}\n' if isinstance(v, int) else f'{k} = "{v}"\n' for k, v in table.items())
        parts.append(f'\n[[models]]\nname = "{name(index)}"\nmin_replicas = 0\nmax_replicas = 1\n\n'
                     f'[models.provisioner]\n{fields}')
    return "".join(parts)


def ecs_services(moto_url: str, count: int) -> None:
    import boto3

    ecs = boto3.client("ecs", region_name="us-east-1", endpoint_url=moto_url)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_url)
    vpc = ec2.create_vpc(CidrBlock="10.41.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.41.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="workers", Description="workers", VpcId=vpc)["GroupId"]
    network = {"awsvpcConfiguration": {"subnets": [subnet], "securityGroups": [group]}}
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.register_task_definition(family="worker", networkMode="awsvpc", requiresCompatibilities=["FARGATE"],
                                 cpu="1024", memory="2048",
                                 containerDefinitions=[{"name": "worker", "image": "sluice-worker", "memory": 2048,
                                                        "portMappings": [{"containerPort": PORT}]}])
    for index in range(count):
        ecs.create_service(cluster=CLUSTER, serviceName=service(index), taskDefinition="worker", desiredCount=0,
                           launchType="FARGATE", networkConfiguration=network)


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, **AWS_ENV, "PYTHONPATH": str(tree), "SLUICE_ADMIN_KEY": "bench-admin-key-0123456789abcdef"}


# ---- start ----

def measure_start(tree: Path, count: int, moto_url: str, redis_url: str) -> tuple[float, float]:
    """(seconds to the first /livez 200, seconds until every service was adopted) for one `sluice serve`."""
    import httpx

    from testkit.servers import free_port

    with tempfile.TemporaryDirectory(prefix="sluice-fleet-start-") as data:
        config = Path(data) / "sluice.toml"
        config.write_text(config_toml(count, moto_url, redis_url))
        port = free_port()
        began = time.monotonic()
        process = subprocess.Popen([sys.executable, "-m", "gateway.cli.main", "serve", "--port", str(port),
                                    "--data-dir", data, "--config", str(config)], cwd=tree, env=tree_env(tree),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        adopted, done = [0], threading.Event()

        def pump() -> None:
            for line in process.stdout:
                if '"ecs_service_adopted"' in line:
                    adopted[0] += 1
                    if adopted[0] >= count:
                        done.set()

        threading.Thread(target=pump, daemon=True).start()
        livez = None
        try:
            while time.monotonic() - began < WAIT_S and process.poll() is None:
                if livez is None:
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(f"http://127.0.0.1:{port}/livez", timeout=1).status_code == 200:
                            livez = time.monotonic() - began
                if livez is not None and done.wait(0.05):
                    return livez, time.monotonic() - began
                time.sleep(0.02)
            raise RuntimeError(f"{tree}: livez {livez}, {adopted[0]} of {count} adopted, exit {process.poll()}")
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()


# ---- idle ----

async def gateway_child(count: int, moto_url: str, redis_url: str, data: str) -> None:
    """One gateway's `Endpoints` with every endpoint, in the tree on PYTHONPATH; runs until killed."""
    from gateway.endpoints.scaling import ScalingSettings
    from gateway.endpoints.service import Endpoints
    from gateway.endpoints.spec import parse_endpoint

    specs = [parse_endpoint({"name": name(i), "min_replicas": 0, "max_replicas": 1,
                             "provisioner": provisioner(i, moto_url)}) for i in range(count)]
    settings = ScalingSettings(standby_worker=False, ecs_api_calls_per_second=20)
    # redis-py 8 refuses a pool's 101st connection, which 100 endpoints' first syncs together reach; both trees get
    # the same bigger pool (this tree's fleet asks for it anyway)
    endpoints = await Endpoints.open(f"sqlite:///{data}/gateway.db", specs, Path(data), settings,
                                     redis_url=f"{redis_url}?max_connections=4096")
    await endpoints.start()
    while True:  # how many endpoints this gateway owns and has adopted (attributes the baseline has too)
        owned = sum(1 for c in endpoints.controllers.values() if c.ownership.owner and c._adopted)
        (Path(data) / "adopted").write_text(str(owned))
        await asyncio.sleep(1)


def adopted(root: Path, gateways: int) -> int:
    """Endpoints adopted by their owners, once every gateway's start has returned (0 before)."""
    files = [root / f"g{n}" / "adopted" for n in range(gateways)]
    if not all(f.exists() for f in files):
        return 0
    return sum(int(f.read_text() or 0) for f in files)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_idle(tree: Path, count: int, gateways: int, seconds: float, moto_url: str,
                 redis_url: str) -> tuple[float, float, float]:
    """(Redis commands a second, mean and max CPU % of one core per gateway process) while idle."""
    import redis

    server = redis.Redis.from_url(redis_url)
    server.flushall()
    children = []
    with tempfile.TemporaryDirectory(prefix="sluice-fleet-idle-") as root:
        try:
            for number in range(gateways):
                data = Path(root) / f"g{number}"
                data.mkdir()
                children.append(subprocess.Popen(
                    [sys.executable, str(HERE), "_gateway", "--endpoints", str(count), "--moto", moto_url,
                     "--redis", redis_url, "--data", str(data)], cwd=tree, env=tree_env(tree),
                    stdout=subprocess.DEVNULL, stderr=(data / "stderr").open("w")))
            deadline = time.monotonic() + WAIT_S
            while adopted(Path(root), gateways) < count:  # every endpoint's owner has adopted its service
                if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                    errors = [(Path(root) / f"g{n}" / "stderr").read_text()[-2000:] for n in range(gateways)]
                    raise RuntimeError(f"{tree}: not every endpoint was adopted: {errors}")
                time.sleep(0.5)
            # past the followers' first syncs and the owners' first looks at their tasks (the steady pace: 20 s at
            # 100 endpoints), whose first shared lists every gateway then reads once
            time.sleep(30)
            commands, cpu, began = server.info("commandstats"), [cpu_seconds(c.pid) for c in children], time.monotonic()
            time.sleep(seconds)
            elapsed = time.monotonic() - began
            calls = {name: stats["calls"] - commands.get(name, {}).get("calls", 0)
                     for name, stats in server.info("commandstats").items()}
            rate = sum(calls.values()) / elapsed
            top = sorted(calls.items(), key=lambda item: -item[1])[:6]
            print(f"{tree}: commands/s by kind: " + ", ".join(f"{n.removeprefix('cmdstat_')} {c / elapsed:,.0f}"
                                                           for n, c in top), flush=True)
            shares = [100 * (cpu_seconds(c.pid) - before) / elapsed for c, before in zip(children, cpu)]
            return rate, sum(shares) / len(shares), max(shares)
        finally:
            for child in children:
                child.kill()
                child.wait()
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "_gateway"])
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout to run the same way")
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1",
                        help="20 endpoints x 3 gateways, 10 s idle")
    parser.add_argument("--idle-only", action="store_true", help="the idle part alone (no start measured)")
    parser.add_argument("--moto", default="")
    parser.add_argument("--redis", default="")
    parser.add_argument("--data", default="")
    args = parser.parse_args()
    if args.mode == "_gateway":  # bench/gateway.py would shadow the package of the tree on PYTHONPATH
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE.parent]
        asyncio.run(gateway_child(args.endpoints, args.moto, args.redis, args.data))
        return
    if args.quick:
        args.endpoints, args.gateways, args.idle_seconds = 20, 3, 10.0
    sys.path.insert(0, str(REPO))
    os.environ.update(AWS_ENV)
    from testkit.local_aws import moto_server
    from testkit.servers import redis_server

    trees = [("this tree", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    results = {}
    with moto_server() as moto_url, redis_server() as redis:
        ecs_services(moto_url, args.endpoints)
        for label, tree in trees:
            import redis as redis_module

            redis_module.Redis.from_url(redis.url).flushall()
            livez = adopted = math.nan
            if not args.idle_only:
                livez, adopted = measure_start(tree, args.endpoints, moto_url, redis.url)
                print(f"{label}: start with {args.endpoints} ECS endpoints: first /livez {livez:.1f} s, every "
                      f"service adopted {adopted:.1f} s", flush=True)
            rate, mean, peak = measure_idle(tree, args.endpoints, args.gateways, args.idle_seconds, moto_url,
                                            redis.url)
            print(f"{label}: idle {args.endpoints} endpoints x {args.gateways} gateways: {rate:,.0f} Redis "
                  f"commands/s, gateway CPU {mean:.1f} % of a core (max {peak:.1f} %)", flush=True)
            results[label] = (livez, adopted, rate, mean)
    if len(results) == 2:
        ours, base = results["this tree"], results["baseline"]
        print(f"ratios (this tree / baseline): first /livez {ours[0] / base[0]:.3f}, every service adopted "
              f"{ours[1] / base[1]:.2f}, Redis commands/s {ours[2] / base[2]:.3f}, gateway CPU "
              f"{ours[3] / max(base[3], 0.01):.3f}")


if __name__ == "__main__":
    main()
