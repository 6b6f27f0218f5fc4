"""The sweep that purges stored responses past their retention (`[responses] retention_s`), every
`sweep_interval_s`, in each gateway (a fleet's sweeps delete the same rows; the second finds none). Reads never
wait for it: an expired response is already gone for `GET` and `previous_response_id`."""

from __future__ import annotations

import structlog

from common.errors import SluiceError
from common.periodic import Periodic
from gateway.dialects.responses.store import ResponseStore

log = structlog.get_logger("gateway")


def response_sweeper(store: ResponseStore, interval_s: float) -> Periodic:
    return Periodic("responses-sweeper", interval_s, lambda: _sweep(store))


async def _sweep(store: ResponseStore) -> None:
    try:
        purged = await store.purge_expired()
        if purged:
            log.info("responses.purged", expired=purged)
    except SluiceError as error:  # the database is away: the next round tries again
        log.warning("responses.purge_failed", error=error.message)
    except Exception:  # a bug must not end the sweeps for good
        log.exception("responses.purge_failed")
