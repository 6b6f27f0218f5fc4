# The worker image: one model worker on a GPU. Build from the repository root:
#   docker build -f infra/docker/worker.Dockerfile -t sluice-worker .
# The base is plain Python: torch's CUDA wheels bring the CUDA runtime, cuBLAS, cuDNN and NCCL as nvidia-*
# wheels, so a nvidia/cuda base would hold a second copy of each (~3 GB). The host's NVIDIA driver comes in
# through the ECS GPU runtime; modules/worker_pool checks that it serves this image's CUDA (cu128 = 12.8).
# Layers, largest and least often changed first: torch + CUDA, then the other dependencies (rebuilt when
# pyproject.toml changes), then our code (a ~1 MB wheel: a code change pushes and pulls only that layer).
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
# the worker's dependency list alone, so its layer below depends on pyproject.toml and not on the code
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['worker']))" > /requirements.txt
COPY gateway gateway
COPY auth auth
COPY billing billing
COPY common common
COPY storage storage
COPY worker worker
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
# torch's CUDA wheel index; modules/worker_pool's image_cuda_version must name the same CUDA
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SLUICE_LOG_FORMAT=json \
    SLUICE_MODEL_CACHE=/var/cache/sluice/models \
    HF_HOME=/var/cache/sluice/hf \
    PATH=/opt/sluice/bin:${PATH}
# layer 1: torch pinned from the CUDA index, with its nvidia-* CUDA libraries
RUN python -m venv /opt/sluice \
    && /opt/sluice/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX}" torch==2.13.0
# layer 2: the other dependencies of `.[worker]` (torch==2.13.0 is already satisfied), bitsandbytes among them,
# each at the version of the lock that CI installs (`make install`)
COPY --from=build /requirements.txt /tmp/requirements.txt
COPY requirements.lock /tmp/requirements.lock
RUN /opt/sluice/bin/pip install --no-cache-dir -c /tmp/requirements.lock -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt /tmp/requirements.lock \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin sluice \
    && mkdir -p /var/lib/sluice /var/cache/sluice \
    && chown sluice:sluice /var/lib/sluice /var/cache/sluice
# layer 3: the code, without dependencies (they are all above)
COPY --from=build /wheels /wheels
RUN /opt/sluice/bin/pip install --no-cache-dir --no-deps /wheels/sluice-*.whl \
    && rm -rf /wheels
USER 10001:10001
EXPOSE 8100
# /health answers 200 once the model is loaded and warm (loading a large model takes minutes)
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health', timeout=2)"]
ENTRYPOINT ["sluice"]
CMD ["worker", "--host", "0.0.0.0", "--port", "8100", "--data-dir", "/var/lib/sluice"]
