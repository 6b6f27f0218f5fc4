"""The `sluice` command: `serve`, `worker`, and the operator's `users`, `teams`, `keys` commands.

A `serve` that cannot start (bad configuration, unusable admin key, unreachable database, port in use, or
any `StartupError` of the lifespan) prints one line saying what and how to fix it, and exits 1; the
lifespan has closed whatever it opened, local workers included.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys

import uvicorn

from auth.cli import register
from billing.cli import register as register_usage
from common.worker_settings import variable
from gateway.batches.upload import UPLOAD_PATH
from gateway.cli.draining import DrainingServer
from gateway.cli.processes import Siblings, inherited_socket, shared_wal_root
from gateway.config import Settings, load_settings
from gateway.edge.access_log import configure_logging
from gateway.edge.app import create_app
from gateway.edge.http_limits import edge_protocol
from gateway.edge.lifespan import STATE_FAILURE
from gateway.edge.startup_failure import exit_status, on_failure
from gateway.edge.startup_failure import fail as stop_with_failure
from gateway.secrets import key_pepper

# bench-only: "1" serves without the usage ledger, the baseline bench/ledger_gateway.py measures the ledger against;
# no setting, so no deployment can turn billing off
BENCH_NO_LEDGER = "SLUICE_BENCH_NO_LEDGER"


def fail(message: str) -> int:
    print(f"sluice: {message}", file=sys.stderr, flush=True)
    return 1


def listen(settings: Settings) -> socket.socket:
    """Bind before anything starts, so a taken port fails at once and leaves no worker behind."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux; elsewhere the write timeout alone ends stalled streams
            # inherited by accepted connections: data a client leaves unread this long aborts its connection
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(settings.stream_write_timeout_s * 1000))
        sock.bind((settings.host, settings.port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class LifespanFailureFilter(logging.Filter):
    """uvicorn logs a failed start as a traceback plus "Application startup failed": `serve` prints the
    lifespan's one line instead. Its other messages (and a failed shutdown) pass."""

    def __init__(self, server: uvicorn.Server) -> None:
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        return self.server.started or "lifespan" not in record.pathname


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, host=args.host, port=args.port, data_dir=args.data_dir)
    configure_logging(settings.log_format)
    os.environ[variable("log_format")] = settings.log_format  # the workers log the same way
    if settings.gateway_processes > 1:
        try:
            settings.wal_root = shared_wal_root(settings)
        except ValueError as exc:
            return fail(str(exc))
    sock = inherited_socket()  # one of several processes, started by the first (gateway/cli/processes.py)
    siblings = None
    if sock is None:
        try:
            sock = listen(settings)
        except (OSError, OverflowError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return fail(f"cannot listen on {settings.host}:{settings.port} ({reason}): stop the program that uses "
                        "it, or choose another address with --host / --port")
        if settings.gateway_processes > 1:
            siblings = Siblings(sock, args.argv, settings.gateway_processes - 1, stop_with_failure)
    app = create_app(settings, ledger=os.environ.get(BENCH_NO_LEDGER) != "1")
    # SIGTERM: new requests get a 503 while running streams finish (up to shutdown_grace_seconds or the longest
    # drain_seconds); then the endpoints stop and the usage log drains (gateway/cli/draining.py)
    drain_s = max([settings.shutdown_grace_seconds, *(model.drain_seconds for model in settings.models)])
    server = DrainingServer(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                           loop="uvloop", lifespan="on",
                                           # httptools, with bounds on heads, bodies and connections per client
                                           http=edge_protocol(settings.http, settings.trusted_proxies,
                                                              frozenset({UPLOAD_PATH.encode()})),
                                           timeout_keep_alive=settings.http.keep_alive_timeout_s,
                                           access_log=False,  # our own line per request (gateway/edge/access_log.py)
                                           timeout_graceful_shutdown=drain_s,
                                           # the client stays the TCP peer: X-Forwarded-For is read only from
                                           # trusted_proxies (auth.forwarded), never rewritten by uvicorn
                                           proxy_headers=False), app, drain_s)
    on_failure(lambda: setattr(server, "should_exit", True))
    quiet = LifespanFailureFilter(server)
    logging.getLogger("uvicorn.error").addFilter(quiet)
    others = 0
    with siblings.signals_held() if siblings is not None else contextlib.nullcontext():
        if siblings is not None:
            siblings.start_when(lambda: server.started)
        try:
            server.run(sockets=[sock])
        except SystemExit:  # uvicorn's exit after a failed lifespan: the lifespan said why
            if app.state.get(STATE_FAILURE) is None:
                raise
        finally:
            logging.getLogger("uvicorn.error").removeFilter(quiet)
            if siblings is not None:
                others = siblings.stop(timeout=drain_s + 30)
            sock.close()
    failure = app.state.get(STATE_FAILURE)
    if failure is not None:
        return fail(f"cannot start: {failure}")
    return exit_status() or others


def _worker(args: argparse.Namespace) -> int:
    try:
        from worker.__main__ import main as worker_main  # only here: the gateway itself never loads the worker
    except ImportError as exc:  # the gateway image installs `.[gateway]` only
        raise SystemExit(f"sluice: the worker is not installed here ({exc}); install sluice[worker]") from None
    worker_main(args.worker_args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice LLM inference gateway")
    parser.add_argument("--config", help="TOML config file")
    parser.add_argument("--data-dir", help="data directory (database, caches)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway and its local workers")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    # SUPPRESS: given after `serve` they win, given before it they are not reset to None
    serve.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS)
    serve.add_argument("--config", dest="config", default=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)
    worker = commands.add_parser("worker", help="run one model worker (for remote workers)")
    worker.add_argument("worker_args", nargs=argparse.REMAINDER)
    worker.set_defaults(func=_worker)
    register(commands)
    register_usage(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # argparse's REMAINDER refuses options first: `sluice worker --port P`
        return _worker(argparse.Namespace(worker_args=argv[1:]))
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # the processes `serve` may start run the same command
    if args.command not in ("serve", "worker"):
        settings = load_settings(args.config, data_dir=args.data_dir)
        args.database_url = settings.resolved_database_url
        args.pepper = key_pepper(settings)  # the server's: a key made here is found there, and back
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
