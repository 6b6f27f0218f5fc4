"""`POST /v1/files` as it streams in: the multipart body is parsed piece by piece as the edge hands it over
(gateway/edge/http_limits.py lets this route's body through without holding it whole, counting only what waits to
be read), the file part goes to an `Upload` (files.py) that checks each piece against the bounds and writes it in
chunks, so a 200 MB file passes with the gateway's memory bounded by a few chunks, not by the file.

Bounds of its own: the team's uploads in progress (`team_max_concurrent_uploads`, 429), `upload_timeout_s` for the
whole body (408), at most MAX_PARTS form parts with short headers, `purpose` at most MAX_PURPOSE_BYTES."""

from __future__ import annotations

import asyncio

from litestar import Request
from litestar.exceptions import HTTPException
from multipart import MultipartError, MultipartSegment, PushMultipartParser, parse_options_header

from common.errors import BadRequest, PayloadTooLarge, SluiceError
from gateway.batches.files import FileStore, Upload
from gateway.config import BatchSettings
from gateway.serving.dialect import check, required

UPLOAD_PATH = "/v1/files"  # the edge streams this route's body (gateway/cli/main.py hands it the path)
MAX_PARTS = 8
MAX_PART_HEADER_BYTES = 4096
MAX_PURPOSE_BYTES = 64


class UploadTimedOut(SluiceError):
    status, type, code = 408, "timeout", "upload_timeout"


class UploadCut(BadRequest):
    code = "upload_incomplete"


async def receive_upload(request: Request, files: FileStore, team_id: str, settings: BatchSettings) -> dict:
    """The upload's file object, once its body is whole and within every bound; nothing kept otherwise."""
    _, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get("boundary", "")
    check(bool(boundary) and len(boundary) <= 200, "the multipart/form-data content type needs a boundary",
          "content-type")
    upload = await files.begin_upload(team_id)
    async with upload:
        try:
            async with asyncio.timeout(settings.upload_timeout_s):
                purpose, filename = await _parse(request, boundary, upload)
        except TimeoutError:
            raise UploadTimedOut(f"The upload did not arrive within upload_timeout_s "
                                 f"({settings.upload_timeout_s:g} s).") from None
        _check_purpose(purpose)
        required(filename is not None, "file")
        return await upload.commit(filename or "upload.jsonl")


def _check_purpose(purpose: bytes | bytearray | str | None) -> None:
    required(purpose is not None and bool(purpose), "purpose")
    text = bytes(purpose).decode("utf-8", "replace") if isinstance(purpose, (bytes, bytearray)) else purpose
    check(text == "batch", f"purpose must be 'batch' (got {str(text)[:MAX_PURPOSE_BYTES]!r})", "purpose")


async def _parse(request: Request, boundary: str, upload: Upload) -> tuple[str | None, str | None]:
    """(purpose, the file's name) of the form, the file part written to `upload` as it comes."""
    purpose: bytearray | None = None
    filename: str | None = None
    field: str | None = None
    parser = PushMultipartParser(boundary, max_header_size=MAX_PART_HEADER_BYTES, max_segment_count=MAX_PARTS)
    try:
        with parser:
            async for chunk in request.stream():
                if not chunk:
                    continue  # litestar's end-of-body marker; the parser's own end is checked on close
                for event in parser.parse(chunk):
                    if isinstance(event, MultipartSegment):
                        field = event.name
                        if field == "file":
                            check(filename is None, "send one file per upload", "file")
                            filename = event.filename or "upload.jsonl"
                        elif field == "purpose":
                            check(purpose is None, "send purpose once", "purpose")
                            purpose = bytearray()
                    elif event is None:
                        if field == "purpose":  # a wrong purpose refused before the file is streamed in
                            _check_purpose(purpose)
                        field = None
                    elif field == "file":
                        await upload.write(event)
                    elif field == "purpose" and purpose is not None:
                        purpose += event
                        check(len(purpose) <= MAX_PURPOSE_BYTES, "purpose must be 'batch'", "purpose")
    except MultipartError as bad:
        raise BadRequest(f"the multipart body could not be read: {str(bad)[:200]}") from None
    except HTTPException as refused:  # litestar: over the route's body bound, or the client went away
        if refused.status_code == 413:
            raise PayloadTooLarge(f"A file may hold at most {upload.settings.max_file_bytes} bytes.",
                                  param="file") from None
        raise UploadCut("the upload ended before its body was complete") from None
    return (purpose.decode("utf-8", "replace") if purpose is not None else None), filename
