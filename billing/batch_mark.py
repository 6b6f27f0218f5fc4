"""Which batch line a usage record belongs to: the ledger's `batch_id` and `custom_id`."""

from __future__ import annotations

import msgspec


class BatchMark(msgspec.Struct, frozen=True):
    batch_id: str
    custom_id: str
