"""What the batch routes and the dashboard share, opened by the gateway's lifespan: the batch and file stores on
the gateway's database (the auth store's handle), file bodies where `[batches]` puts them (bodies.py) and this
gateway's runner."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.batches.bodies import open_bodies
from gateway.batches.files import FileStore
from gateway.batches.runner import BatchRunner
from gateway.batches.store import BatchStore
from gateway.config import Settings
from gateway.serving.services import Services

SQLITE_CHECKPOINT_BYTES = 4 << 20


@dataclass
class BatchService:
    store: BatchStore
    files: FileStore
    runner: BatchRunner
    settings: Settings


def open_batches(services: Services) -> BatchService:
    """The stores and the runner (not started). The files' disk floor: twice the ledger's reserve plus one SQLite
    checkpoint, as the stored responses keep (gateway/dialects/responses/store.py)."""
    settings = services.settings
    db = services.auth.store.db
    store = BatchStore(db, settings.batches.team_max_enqueued_tokens)
    config = settings.batches
    bodies = open_bodies(db, settings.data_path / "batch_files", config.file_bucket, config.file_prefix,
                         config.s3_endpoint_url)
    files = FileStore(db, bodies, config, 2 * settings.ledger_min_free_bytes + SQLITE_CHECKPOINT_BYTES)
    return BatchService(store, files, BatchRunner(services, store, files, settings.batches), settings)
