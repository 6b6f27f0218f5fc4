"""The `sluice` command: `serve`, `worker`, and the operator's `users`, `teams`, `keys` commands."""

from __future__ import annotations

import argparse
import os
import sys

from gateway.config import load_settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.logs import configure_logging
    from gateway.shutdown import exit_status, on_failure

    settings = load_settings(args.config, host=args.host, port=args.port, data_dir=args.data_dir)
    configure_logging(settings.log_format)
    os.environ["SLUICE_LOG_FORMAT"] = settings.log_format  # the workers log the same way
    app = create_app(settings)
    print(f"Sluice gateway listening on http://{settings.host}:{settings.port} "
          f"(models: {', '.join(m.name for m in settings.models)})", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                           loop="uvloop", http="httptools", lifespan="on",
                                           timeout_graceful_shutdown=10))
    on_failure(lambda: setattr(server, "should_exit", True))
    server.run()
    return exit_status()


def _worker(args: argparse.Namespace) -> int:
    from worker.__main__ import main as worker_main

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
    from auth.cli import register

    register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in ("serve", "worker"):
        from gateway.secrets import load_pepper, pepper_path

        settings = load_settings(args.config, data_dir=args.data_dir)
        args.database_url = settings.resolved_database_url
        load_pepper(settings.data_path)
        args.pepper_file = str(pepper_path(settings.data_path))
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
