"""Where an adapter's files are: a local PEFT directory as is, an s3:// prefix downloaded once into
the data dir (the same download as model weights, worker/loading.py)."""

from __future__ import annotations

from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from worker.loading import ModelLoadError, download_s3_prefix
from worker.lora.errors import AdapterError
from worker.lora.peft_format import CONFIG_FILE

_MISSING = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}


def adapter_directory(source: str, data_dir: Path) -> Path:
    if source.startswith("s3://"):
        return _from_s3(source, data_dir)
    directory = Path(source).expanduser()
    if not directory.is_dir():
        raise AdapterError(f"adapter directory {source} does not exist", kind="not_found")
    return directory


def _from_s3(url: str, data_dir: Path) -> Path:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket or not prefix.strip("/"):
        raise AdapterError(f"{url} must name a bucket and a prefix (s3://bucket/prefix)")
    try:
        return download_s3_prefix(url, data_dir, marker=CONFIG_FILE)
    except ModelLoadError as exc:  # nothing under the prefix
        raise AdapterError(str(exc), kind="not_found") from None
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        raise AdapterError(f"cannot download {url}: {code or exc}",
                           kind="not_found" if code in _MISSING else "unavailable") from None
    except (BotoCoreError, OSError) as exc:  # no endpoint, no credentials, a full disk
        raise AdapterError(f"cannot download {url}: {exc}", kind="unavailable") from None
