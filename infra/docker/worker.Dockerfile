# The worker image: one model worker on a GPU, `pip install .[worker]` over torch's CUDA build.
# Build from the repository root:  docker build -f infra/docker/worker.Dockerfile -t sluice-worker .
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/build && /opt/build/bin/pip install --no-cache-dir "setuptools>=68" wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY auth auth
COPY billing billing
COPY common common
COPY storage storage
COPY worker worker
RUN /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
# torch's CUDA wheel index; must match a CUDA the base image's driver range supports
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SLUICE_LOG_FORMAT=json \
    SLUICE_MODEL_CACHE=/var/cache/sluice/models \
    HF_HOME=/var/cache/sluice/hf \
    PATH=/opt/sluice/bin:${PATH}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
# torch first and pinned, from the CUDA index: `.[worker]` then finds torch==2.13.0 satisfied
RUN python3.12 -m venv /opt/sluice \
    && /opt/sluice/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX}" torch==2.13.0 \
    && /opt/sluice/bin/pip install --no-cache-dir bitsandbytes \
    && wheel="$(ls /wheels/sluice-*.whl)" \
    && /opt/sluice/bin/pip install --no-cache-dir "${wheel}[worker]" \
    && rm -rf /wheels \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin sluice \
    && mkdir -p /var/lib/sluice /var/cache/sluice \
    && chown sluice:sluice /var/lib/sluice /var/cache/sluice
USER 10001:10001
EXPOSE 8100
# /health answers 200 once the model is loaded and warm (loading a large model takes minutes)
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python3.12", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/health', timeout=2)"]
ENTRYPOINT ["sluice"]
CMD ["worker", "--host", "0.0.0.0", "--port", "8100", "--data-dir", "/var/lib/sluice"]
