"""What the gateway shares with its workers, and nothing more: the worker secret and an environment
of allow-listed variables.

The secret (worker/secret.py) is `SLUICE_WORKER_SECRET` when set, which remote workers must be given
too; otherwise one generated at each gateway start, which only the local workers it starts receive.
A worker process never sees the gateway's own secrets (`SLUICE_KEY_PEPPER`, `SLUICE_ADMIN_KEY`, the
database and Redis URLs): it gets the variables below, which run Python, torch, CUDA, the Hugging Face
libraries and an S3 model source, and the worker settings of the host (`INHERITED`).
"""

from __future__ import annotations

import os
import secrets

from common.protocol import WORKER_SECRET_ENV
from common.worker_settings import INHERITED, variable

WORKER_VARIABLES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "VIRTUAL_ENV",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "TOKENIZERS_PARALLELISM",
    "CC",  # q4's C build (worker/engine/native/build.py)
    *(variable(name) for name in INHERITED),  # the worker settings of the host (common/worker_settings.py)
})
WORKER_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_",
                   "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "XDG_", "AWS_")
_generated: list[str] = []


def worker_secret() -> str:
    """The secret this gateway process sends to its workers (the same on every call)."""
    configured = os.environ.get(WORKER_SECRET_ENV)
    if configured:
        return configured
    if not _generated:
        _generated.append(secrets.token_urlsafe(32))
    return _generated[0]


def worker_environment(secret: str) -> dict[str, str]:
    """The environment of a local worker process."""
    inherited = {name: value for name, value in os.environ.items()
                 if name in WORKER_VARIABLES or name.startswith(WORKER_PREFIXES)}
    # passive OpenMP waits: spinning threads starve the gateway and each other on small hosts
    return {"OMP_WAIT_POLICY": "PASSIVE", **inherited, WORKER_SECRET_ENV: secret}
