# The gateway image: the Litestar gateway with auth and billing, `pip install .[gateway]`, no torch.
# Build from the repository root:  docker build -f infra/docker/gateway.Dockerfile -t sluice-gateway .
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY auth auth
COPY billing billing
COPY common common
COPY storage storage
COPY worker worker
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SLUICE_LOG_FORMAT=json \
    SLUICE_DATA_DIR=/var/lib/sluice
COPY --from=build /wheels /wheels
# every version from the lock that CI installs (`make install`)
COPY requirements.lock /tmp/requirements.lock
RUN wheel="$(ls /wheels/sluice-*.whl)" \
    && pip install --no-cache-dir -c /tmp/requirements.lock "${wheel}[gateway]" \
    && rm -rf /wheels /tmp/requirements.lock \
    && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin sluice \
    && mkdir -p /var/lib/sluice \
    && chown sluice:sluice /var/lib/sluice
# the billing write-ahead log lives here: an EFS volume on ECS, so a crashed task's log survives
VOLUME ["/var/lib/sluice"]
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=2)"]
ENTRYPOINT ["sluice"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
