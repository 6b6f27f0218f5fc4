"""The adapters a worker holds: an LRU of at most `capacity`, filled lazily on background threads.

The engine thread is the only caller (besides `loaded_names`). It asks `get` for a waiting request's
adapter: a resident one comes back at once; otherwise a load starts on a thread of its own (reading,
checking and laying out the files: disk or S3 time that must not stall the rows that are decoding, nor
the loads of other adapters: one stalled source holds up only its own requests) and the request keeps
waiting. Loads in flight count against `capacity`, which so bounds the loader threads too. A finished
load calls `wake` so an idle engine looks again. A slot is freed by evicting the least recently used
adapter that no running row and no request ahead in the queue needs; when there is none, the request
waits for rows to finish.

A failed load answers every request that was waiting for it (they came before the failure) and every
request for it during a backoff (`retry_s`, doubling while loads keep failing, up to RETRY_MAX_S): a
broken or unreachable source costs one load per backoff, not one per call. The first request after the
backoff tries again, so an operator who fixes the files needs no restart.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from common.protocol import AdapterRef
from worker.lora.adapter import LoraAdapter, lay_out, model_shape
from worker.lora.errors import AdapterError
from worker.lora.peft_format import read_adapter
from worker.lora.sources import adapter_directory

log = structlog.get_logger(__name__)
Key = tuple[str, str]  # (name, source): a name registered again with another source is another adapter
RETRY_MAX_S = 600.0  # the longest backoff after repeated failures (unless `retry_s` itself is longer)


@dataclass
class Failure:
    error: AdapterError
    ended: float  # perf_counter when the load failed: requests that came earlier were waiting for it
    retry_at: float  # perf_counter before which no new load starts
    failures: int  # loads that failed in a row (the backoff doubles with each)


def key_of(ref: AdapterRef) -> Key:
    return ref.name, ref.source


class AdapterStore:
    def __init__(self, decoder_layers: list[torch.nn.Module], dtype: torch.dtype, device: torch.device, *,
                 capacity: int, max_rank: int, data_dir: Path, retry_s: float = 30.0,
                 wake: Callable[[], None] = lambda: None):
        self._shape = model_shape(decoder_layers)
        self._dtype, self._device = dtype, device
        self.capacity, self._max_rank, self._data_dir, self._wake = capacity, max_rank, data_dir, wake
        self._retry_s = retry_s
        self._resident: OrderedDict[Key, LoraAdapter] = OrderedDict()  # least recently used first
        self._loading: dict[Key, Future] = {}
        self._failed: dict[Key, Failure] = {}  # kept after the backoff too: a new failure doubles it
        self.loaded_names: tuple[str, ...] = ()  # read by /load from other threads: replaced, never mutated
        self._sources: dict[str, threading.Lock] = {}  # one download at a time into a source's directory
        self._sources_lock = threading.Lock()

    def get(self, ref: AdapterRef, since: float, reserved: set[Key]) -> LoraAdapter | None:
        """The adapter if resident (now the most recently used), else None while it loads; raises the
        AdapterError of a load that failed after `since` (perf_counter of the request's arrival) or whose
        backoff still runs (its `retry_after_s` says how long).
        `reserved`: adapters that must not be evicted to make room (in use, or wanted earlier)."""
        key = key_of(ref)
        if key in self._resident:
            self._resident.move_to_end(key)
            return self._resident[key]
        failed = self._failed.get(key)
        if failed is not None and key not in self._loading:
            now = time.perf_counter()
            if since <= failed.ended or now < failed.retry_at:
                failed.error.retry_after_s = max(failed.retry_at - now, 0.0)
                raise failed.error
        future = self._loading.get(key)
        if future is None:
            if self._make_room(reserved):
                self._loading[key] = future = Future()
                threading.Thread(target=self._serve, args=(ref, future), name=f"sluice-lora-load-{ref.name}",
                                 daemon=True).start()
            return None
        if not future.done():
            return None
        del self._loading[key]
        try:
            adapter = future.result()
        except AdapterError as error:
            self._remember(key, error)
            raise
        self._failed.pop(key, None)
        self._resident[key] = adapter
        self.loaded_names = tuple(name for name, _ in self._resident)
        return adapter

    def _remember(self, key: Key, error: AdapterError) -> None:
        now = time.perf_counter()
        before = self._failed.get(key)
        failures = before.failures + 1 if before is not None else 1
        backoff = min(self._retry_s * 2 ** (failures - 1), max(self._retry_s, RETRY_MAX_S))
        self._failed[key] = Failure(error, now, now + backoff, failures)
        error.retry_after_s = backoff

    def loading(self, ref: AdapterRef) -> bool:
        """Whether `ref` is being loaded (after `get` said None: else it waits for a free slot)."""
        return key_of(ref) in self._loading

    def _make_room(self, reserved: set[Key]) -> bool:
        while len(self._resident) + len(self._loading) >= self.capacity:
            victim = next((key for key in self._resident if key not in reserved), None)
            if victim is None:
                return False
            evicted = self._resident.pop(victim)
            log.info("adapter_evicted", adapter=evicted.name, source=evicted.source)
        self.loaded_names = tuple(name for name, _ in self._resident)
        return True

    def _serve(self, ref: AdapterRef, future: Future) -> None:
        try:
            future.set_result(self._load(ref))
        except AdapterError as error:
            log.warning("adapter_load_failed", adapter=ref.name, source=ref.source, kind=error.kind,
                        reason=error.message)
            future.set_exception(error)
        except Exception as error:  # a bug or an odd file: the request's error, never a lost wake-up
            log.exception("adapter_load_crashed", adapter=ref.name, source=ref.source)
            future.set_exception(AdapterError(f"cannot load adapter {ref.name!r}: {type(error).__name__}",
                                              kind="internal"))
        self._wake()

    def _load(self, ref: AdapterRef) -> LoraAdapter:
        started = time.perf_counter()
        with self._sources_lock:  # two names for one source: one download into its directory
            source_lock = self._sources.setdefault(ref.source, threading.Lock())
        with source_lock:
            directory = adapter_directory(ref.source, self._data_dir)
        weights = read_adapter(directory, self._shape, self._max_rank)
        adapter = lay_out(ref.name, ref.source, weights, self._shape, self._dtype, self._device)
        log.info("adapter_loaded", adapter=ref.name, source=ref.source, rank=adapter.rank,
                 mib=round(adapter.nbytes / 2**20, 1), seconds=round(time.perf_counter() - started, 3))
        return adapter
