"""`python -m worker`: load one model and serve it (started and supervised by `sluice serve`)."""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path

import msgspec
import structlog
import uvicorn

from worker.engine.engine import Engine
from common.logs import configure_logging
from worker.loading import load_model
from common.protocol import WORKER_SECRET_ENV, ModelConfig, ModelInfo
from worker.secret import bind_refusal
from worker.server import create_worker_app
from worker.threads import torch_threads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("--model-json", default="{}", help="a ModelConfig as JSON")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--data-dir", default=".data")
    parser.add_argument("--worker-id", default="")
    args = parser.parse_args(argv)
    secret = os.environ.get(WORKER_SECRET_ENV) or None
    refusal = bind_refusal(args.host, secret)
    if refusal:
        raise SystemExit(refusal)
    config = msgspec.json.decode(args.model_json.encode(), type=ModelConfig)
    configure_logging(os.environ.get("SLUICE_LOG_FORMAT", "json"))
    worker_id = args.worker_id or f"worker-{uuid.uuid4().hex[:8]}"
    log = structlog.get_logger("worker").bind(worker_id=worker_id, model=config.name)
    import torch

    torch.set_num_threads(torch_threads(config))
    loaded = load_model(config, Path(args.data_dir))
    engine = Engine(loaded, config, worker_id, data_dir=Path(args.data_dir))
    info = ModelInfo(model_id=config.name, model_dtype=str(loaded.dtype).removeprefix("torch."),
                     device=str(loaded.device), quantization=loaded.quantization,
                     max_context=engine.runner.max_context, max_rows=engine.max_rows,
                     vocab_size=engine.vocab_size, eos_token_ids=engine.model_eos, worker_id=worker_id)
    engine.start()
    log.info("worker_ready", port=args.port, dtype=info.model_dtype, quantization=info.quantization)
    try:
        uvicorn.run(create_worker_app(engine, info, secret), host=args.host, port=args.port, log_level="warning",
                    loop="uvloop", http="httptools", lifespan="off")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
