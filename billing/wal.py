"""Write-ahead log of ledger entries: numbered segment files of CRC-framed msgpack payloads.

The writer group-commits: appends made while one write+fsync runs are joined into the next one,
so concurrent requests share an fsync. A crash can leave a torn frame only at a segment's tail;
readers stop there, and nothing after it was ever acknowledged. Anything else the reader cannot read
(a frame larger than MAX_FRAME, which the writer never writes, or a bad checksum with bytes after it)
is corruption: `read_frames` reports it, and the shipper stops there rather than skip what follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
import zlib
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_HEADER = struct.Struct("<II")  # payload length, crc32 of payload
_PREFIX, _SUFFIX = "wal-", ".log"
MAX_FRAME = 1 << 20  # the largest payload: the writer refuses larger ones, the reader takes no larger one
_READ_CHUNK = 4 << 20  # > MAX_FRAME, so a chunk always holds a whole frame when one is there


def segment_path(wal_dir: Path, seq: int) -> Path:
    return wal_dir / f"{_PREFIX}{seq:012d}{_SUFFIX}"


def list_segments(wal_dir: Path) -> list[int]:
    seqs = []
    for name in os.listdir(wal_dir):
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
            digits = name[len(_PREFIX):-len(_SUFFIX)]
            if digits.isdigit():
                seqs.append(int(digits))
    return sorted(seqs)


def frame(payload: bytes) -> bytes:
    """The frame of one payload; ValueError for one the reader would not take back."""
    if len(payload) > MAX_FRAME:
        raise ValueError(f"a ledger entry of {len(payload)} bytes is over the log's frame limit of {MAX_FRAME}")
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class Corrupt(Exception):
    """Bytes in a segment that no frame the writer wrote can explain, with more of the segment after them."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path.name} at byte {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


def read_frames(path: Path, offset: int, limit: int | None, max_frames: int) -> tuple[list[bytes], int]:
    """Payloads of whole, intact frames from `offset` up to `limit` bytes (None: end of file);
    returns them with the offset just past the last one. A torn tail (what a crash mid-write leaves at
    the end of a file: no whole frame in it) ends the read quietly; any other frame that cannot be read
    raises Corrupt, once no whole frame comes before it."""
    payloads: list[bytes] = []
    with open(path, "rb") as f:
        file_end = os.fstat(f.fileno()).st_size
        f.seek(offset)
        # bounded reads: a replay of a large segment must not re-read its whole tail per batch
        want = _READ_CHUNK if limit is None else min(max(limit - offset, 0), _READ_CHUNK)
        data = f.read(want)
    stop = limit if limit is not None else file_end  # where the readable part of the segment ends
    pos = 0
    while len(payloads) < max_frames and pos + _HEADER.size <= len(data):
        size, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + size
        if 0 < size <= MAX_FRAME and end <= len(data) and zlib.crc32(data[pos + _HEADER.size:end]) == crc:
            payloads.append(data[pos + _HEADER.size:end])
            pos = end
            continue
        if 0 < size <= MAX_FRAME and end > len(data) and offset + end <= stop:
            break  # a whole frame that continues past this read: the next read starts with it
        if payloads:
            break  # hand over what came before; the next read starts at the bad frame
        # at the end of the file (a read that starts at a bad frame always reaches it when the frame could be
        # torn: a frame is far shorter than a read) and with no whole frame after it: a torn tail
        if limit is None and offset + len(data) == file_end and _first_whole_frame(data, pos) is None:
            break
        raise Corrupt(path, offset + pos, _problem(size, end, len(data)))
    return payloads, offset + pos


def _first_whole_frame(data: bytes, start: int) -> int | None:
    """The first offset from `start` where a whole frame with an intact checksum begins (of any size but 0: the
    writer never writes an empty payload, and a zero-filled tail is made of "frames" of 0 bytes)."""
    for at in range(start, len(data) - _HEADER.size):
        size, crc = _HEADER.unpack_from(data, at)
        end = at + _HEADER.size + size
        if 0 < size and end <= len(data) and zlib.crc32(data[at + _HEADER.size:end]) == crc:
            return at
    return None


def _problem(size: int, end: int, available: int) -> str:
    if size == 0:
        return "an empty frame, which the writer never writes"
    if size > MAX_FRAME:
        return f"a frame of {size} bytes, over the frame limit of {MAX_FRAME}"
    if end > available:
        return f"a frame of {size} bytes runs past the durable end of the segment, or into a later whole frame"
    return "a frame's checksum does not match its payload"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Each write is durable when it returns (O_DSYNC: as if fdatasync followed it), so a commit is one syscall: the
# writer thread retakes the GIL from the busy event loop once per commit, not twice (up to the 5 ms switch
# interval each time, under load). Where there is no O_DSYNC, an fsync after the writes.
_DSYNC = getattr(os, "O_DSYNC", 0)


def _resolve(batch: asyncio.Future[None], error: Exception | None) -> None:
    if error is None:
        batch.set_result(None)
    else:
        batch.set_exception(error)
        batch.exception()  # retrieved here too, so an abandoned waiter does not warn


class WalWriter:
    """Appends frames to the newest segment; `append` returns a future that resolves once the
    frame is on stable storage.

    One thread of its own writes and syncs, batch after batch: frames appended while a commit runs are the
    next batch, started by the thread the moment the commit before it returns. Before, each commit was handed
    to an executor by a task on the event loop, so under load a record could wait for the loop twice (to
    start its commit, then to hear of it) on top of the fsyncs themselves."""

    def __init__(self, wal_dir: Path, seq: int, max_segment_bytes: int = 8 << 20) -> None:
        self.wal_dir = wal_dir
        self.max_segment_bytes = max_segment_bytes
        self.seq = seq
        self.durable_offset = 0  # bytes of the current segment known to be on disk
        self.durable = asyncio.Event()  # set after every commit; the shipper waits on it
        self._fd = -1
        self._file_seq, self._file_offset = seq, 0  # the writer thread's view
        self._lock = threading.Lock()  # guards _buf, _batch, _inflight and _closing between the loop and the thread
        self._buf: list[bytes] = []
        self._batch: asyncio.Future[None] | None = None  # waiters of the frames in _buf
        self._inflight: asyncio.Future[None] | None = None  # waiters of the commit under way
        self._work = threading.Event()  # set while _buf may hold frames (or the writer is closing)
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.seq, self.durable_offset = await asyncio.to_thread(self._open_segment, self.seq)
        self._thread = threading.Thread(target=self._serve, name="billing-wal-writer", daemon=True)
        self._thread.start()

    def append(self, data: bytes) -> asyncio.Future[None]:
        with self._lock:
            if self._closing:
                raise RuntimeError("the ledger is closed")
            self._buf.append(data)
            batch = self._batch
            if batch is None:
                batch = self._batch = asyncio.get_running_loop().create_future()
                self._work.set()
        return batch

    async def settle(self) -> None:
        """Wait until every frame appended so far has been committed (or has failed)."""
        with self._lock:  # both at once: the thread moves a batch from one to the other
            batches = (self._inflight, self._batch)
        for batch in batches:
            if batch is not None:
                await asyncio.wait([batch])

    async def close(self) -> None:
        with self._lock:
            self._closing = True
            self._work.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)  # it commits what was appended, then returns
        await asyncio.to_thread(self._close_fd)

    def _settled(self, batch: asyncio.Future[None], position: tuple[int, int] | None, error: Exception | None) -> None:
        """On the writer's loop, in commit order: publish the position (seq and offset together, for the
        shipper) and tell the batch's waiters, on their own loop if they append from another (tests do)."""
        if error is not None:
            log.error("billing.wal.write_failed", error=repr(error))
        elif position is not None:  # always, without an error
            self.seq, self.durable_offset = position
        if batch.get_loop() is self._loop:
            _resolve(batch, error)
        else:
            batch.get_loop().call_soon_threadsafe(_resolve, batch, error)
        with self._lock:  # the thread may be handing over the next batch
            if self._inflight is batch:
                self._inflight = None
        self.durable.set()

    # -- the writer thread only below --

    def _serve(self) -> None:
        while True:
            self._work.wait()
            with self._lock:
                if not self._buf:
                    if self._closing:
                        return
                    self._work.clear()  # under the lock: an append after this sets it again
                    continue
                data, batch = b"".join(self._buf), self._batch
                self._buf, self._batch = [], None
                self._inflight = batch
            position, error = None, None
            try:
                position = self._commit(data)
            except Exception as exc:  # noqa: BLE001 - reported to every waiter of the batch
                error = exc
            assert self._loop is not None and batch is not None  # set by start(), and with the first frame in _buf
            self._loop.call_soon_threadsafe(self._settled, batch, position, error)

    def _open_segment(self, seq: int) -> tuple[int, int]:
        self._fd = os.open(segment_path(self.wal_dir, seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND | _DSYNC,
                           0o600)
        self._file_seq, self._file_offset = seq, os.fstat(self._fd).st_size
        _fsync_dir(self.wal_dir)  # the new name must survive a power cut too
        return self._file_seq, self._file_offset

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _commit(self, data: bytes) -> tuple[int, int]:
        try:
            self._write_all(data)
        except OSError:
            # Retry once in a fresh segment; never append after what a failed write left behind.
            self._discard_partial()
            self._close_fd()
            self._open_segment(self._file_seq + 1)
            try:
                self._write_all(data)
            except OSError:
                self._discard_partial()
                raise
        if self._file_offset >= self.max_segment_bytes:
            self._close_fd()
            self._open_segment(self._file_seq + 1)
        return self._file_seq, self._file_offset

    def _discard_partial(self) -> None:
        """Cut what a failed write left (a full disk writes part of a batch): the batch's waiters are told
        it failed, so none of its frames may reach the database, whole frames included."""
        with contextlib.suppress(OSError):  # the file may be gone with its disk; nothing more to undo then
            os.ftruncate(self._fd, self._file_offset)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if not _DSYNC:
            os.fsync(self._fd)
        self._file_offset += len(data)
