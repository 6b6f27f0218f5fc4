"""An endpoint: a served model name, the worker settings of its replicas, and how it scales.

An `EndpointSpec` holds the worker's config (`ModelConfig`'s fields, inherited so that an entry stays one flat
table) and the deployment: replica bounds, the autoscaler's target, the idle time before scaling to zero, the
activator's queue and wait bounds, the provisioner, and an optional owning team. Each `[[models]]` entry of the
config file is one, and so is each body of `POST /admin/endpoints`. A worker receives only `worker_config()`.

Two queues, two bounds: `max_queue`, the requests waiting inside each worker (a worker setting: it shapes the
replicas), and `max_waiting`, the requests waiting in the gateway's activator for a replica (patchable at run
time). Each setting has one spelling; those of earlier versions (RETIRED) are refused with the one to use.

Every rule raises a `ValueError` naming its field; msgspec reports it with the entry's path.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from common.protocol import ModelConfig

Seconds = Annotated[float, msgspec.Meta(ge=0, le=7 * 86_400.0)]  # finite: `inf` (TOML) would never fire
NAME_LIMIT = 256
_NAME_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a hub id's parts; no "..", no ":" (adapters)
AWS_ID_LIMIT = 512
_AWS_ID = re.compile(rf"[A-Za-z0-9_./:-]{{1,{AWS_ID_LIMIT}}}")  # an ECS name or ARN, a region
ADAPTERS_WORD = "adapters"  # /admin/endpoints/<endpoint>/adapters[/<name>]: never a part of a name
MAX_WAIT_S = 120.0  # a local worker process starts in seconds
# an ECS replica from zero: a GPU host launched by the capacity provider (2-4 min), the ~5-8 GB worker image
# pulled (2-5 min), weights read from S3 and loaded (1-3 min); a warm-pool host skips the first two
ECS_MAX_WAIT_S = 600.0
S3_SCHEME = "s3://"
# spellings of earlier versions: refused, naming what replaced them
RETIRED = {
    "replicas": "`min_replicas` and `max_replicas` (N always-on replicas: both N)",
    "urls": 'a static provisioner: provisioner = {kind = "static", urls = [...]}',
}
# fields a PATCH may change on a running endpoint; the rest shape the replicas themselves
PATCHABLE = ("min_replicas", "max_replicas", "target_concurrency", "idle_seconds", "max_waiting",
             "max_wait_seconds", "drain_seconds", "team_id")


class LocalProvisioning(msgspec.Struct, tag="local", tag_field="kind", forbid_unknown_fields=True):
    """Worker processes on this machine, started and stopped on demand (the embedded default)."""


class StaticProvisioning(msgspec.Struct, tag="static", tag_field="kind", forbid_unknown_fields=True):
    """Fixed worker URLs, run by someone else: never scaled."""

    urls: list[str]


class EcsProvisioning(msgspec.Struct, tag="ecs", tag_field="kind", forbid_unknown_fields=True, kw_only=True):
    """One ECS service per endpoint: its desired count is the replica count, its tasks the replicas."""

    cluster: str
    service: str
    region: str = "us-east-1"
    endpoint_url: str = ""  # "" = AWS itself; a moto or LocalStack URL otherwise
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8100  # the worker container's port
    # test-only (tests/fleet): moto runs no containers and gives tasks addresses nothing here can reach
    test_address_map: str = ""  # a JSON file {"ip:port": "http://127.0.0.1:NNNN"} read at each discovery
    test_throttle_file: str = ""  # while this file exists, every ECS call fails with ThrottlingException

    @property
    def service_key(self) -> str:
        """The ECS service's identity (region, cluster, service; a name and its ARN are one): the fleet's lease and
        shared state for it are keyed by this, whatever endpoint names it."""
        return f"ecs:{self.region}:{_arn_name(self.cluster)}:{_arn_name(self.service)}"


Provisioning = LocalProvisioning | StaticProvisioning | EcsProvisioning


class EndpointSpec(ModelConfig, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    # unset: 1 (at most max_replicas); a static provisioner's size is its URL count
    min_replicas: int | msgspec.UnsetType = msgspec.UNSET
    max_replicas: int | msgspec.UnsetType = msgspec.UNSET  # unset: max(min_replicas, 1)
    target_concurrency: float = 16.0  # in-flight requests per replica the autoscaler aims for
    idle_seconds: Seconds = 300.0  # no request for this long -> scale to zero (when min_replicas is 0)
    max_waiting: int = 256  # requests the activator holds while no replica has room
    # the longest a request waits in the activator's queue; unset: 120 s, or ECS_MAX_WAIT_S for an ECS endpoint
    max_wait_seconds: Seconds | msgspec.UnsetType = msgspec.UNSET
    drain_seconds: Seconds = 120.0  # a replica being removed finishes its streams for at most this long
    provisioner: Provisioning = msgspec.field(default_factory=LocalProvisioning)
    team_id: str | None = None  # a private endpoint: visible and callable by this team only

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_provisioner(self.provisioner)
        self._settle_replicas()
        _check_worker_fields(self)
        if self.max_wait_seconds is msgspec.UNSET:
            self.max_wait_seconds = ECS_MAX_WAIT_S if isinstance(self.provisioner, EcsProvisioning) else MAX_WAIT_S
        _check_scaling(self)
        _check_adapters(self)
        if self.team_id is not None and not self.team_id.strip():
            raise ValueError("`team_id` must be a team id, or absent for a public endpoint")

    def _settle_replicas(self) -> None:
        """The bounds left unset: a static provisioner's are its URL count, the others' at least one replica."""
        if isinstance(self.provisioner, StaticProvisioning):  # never scaled
            size = len(self.provisioner.urls)
            if {self.min_replicas, self.max_replicas} - {msgspec.UNSET, size}:
                raise ValueError("a static provisioner is never scaled: drop `min_replicas` and `max_replicas`")
            self.min_replicas = self.max_replicas = size
            return
        if self.min_replicas is msgspec.UNSET:
            self.min_replicas = 1 if self.max_replicas is msgspec.UNSET else min(1, self.max_replicas)
        if self.max_replicas is msgspec.UNSET:
            self.max_replicas = max(self.min_replicas, 1)

    @property
    def fleet_key(self) -> str:
        """What the fleet's shared state (lease, reports, failure) is keyed by: an ECS endpoint's service, so that
        no two endpoints (or one re-created on another service) share or inherit a lease; else the name."""
        if isinstance(self.provisioner, EcsProvisioning):
            return self.provisioner.service_key
        return self.name

    @property
    def private(self) -> bool:
        return self.team_id is not None

    @property
    def scalable(self) -> bool:
        return not isinstance(self.provisioner, StaticProvisioning)

    def worker_config(self) -> ModelConfig:
        """What each replica's worker is started with (the worker knows nothing of scaling)."""
        return ModelConfig(**{name: getattr(self, name) for name in ModelConfig.__struct_fields__})

    def patched(self, changes: dict[str, Any]) -> EndpointSpec:
        """This spec with run-time `changes` applied and every rule checked again."""
        fixed = [name for name in changes if name not in PATCHABLE]
        if fixed:
            raise ValueError(f"`{fixed[0]}` cannot change on a running endpoint (only {', '.join(PATCHABLE)}); "
                             "delete the endpoint and create it again")
        return msgspec.convert({**msgspec.to_builtins(self), **changes}, EndpointSpec)


def parse_endpoint(raw: Any) -> EndpointSpec:
    """A spec from decoded JSON or TOML; msgspec.ValidationError (or ValueError, for a retired spelling) names
    the field that is wrong."""
    check_spelling(raw)
    return msgspec.convert(raw, EndpointSpec)


def check_spelling(raw: Any) -> None:
    """Refuse a field spelt as an earlier version did, naming the spelling that replaced it (msgspec alone would
    say only that the field is unknown)."""
    if isinstance(raw, dict):
        for old, new in RETIRED.items():
            if old in raw:
                raise ValueError(f"`{old}` is no longer a setting: give {new}")


def check_not_alias(name: str, aliases: Collection[str]) -> None:
    """A name must not be a model alias in any case: an endpoint so named would take the alias over."""
    if name.lower() in aliases:
        raise ValueError(f"`name` must not be {name!r}: the model names {', '.join(sorted(aliases))} "
                         "stand for the first endpoint a caller may see")


def _check_name(name: str) -> None:
    """A name is a path under /admin/endpoints and a `model` value, so it must mean nothing else there: parts of
    letters, digits, `.`, `_`, `-` (no `..`, no `:` that names an adapter), none of them the adapters' path word.
    Clients' model aliases are refused by `Endpoints`, which is given them (`check_not_alias`)."""
    if not name or len(name) > NAME_LIMIT:
        raise ValueError(f"`name` must be 1 to {NAME_LIMIT} characters")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise ValueError("`name` must not contain spaces or control characters")
    parts = name.split("/")
    if "" in parts:
        raise ValueError("`name` may contain `/` only between two parts (as in `org/model`)")
    for part in parts:
        if not _NAME_PART.fullmatch(part):
            raise ValueError(f"`name`: each part between `/` starts with a letter or digit and holds only letters, "
                             f"digits, `.`, `_` and `-` (got {part[:40]!r}; `:` names an adapter, `..` a parent)")
        if part == ADAPTERS_WORD:
            raise ValueError(f"`name` must not hold the part `{ADAPTERS_WORD}`: /admin/endpoints/<name>/"
                             f"{ADAPTERS_WORD} is the path of an endpoint's adapters")


# (field, lowest, highest, what the lowest means): the worker settings that ModelConfig itself leaves unchecked.
# Each bound is one the worker honours: max_queue 0 serves max_batch_size requests at once and queues none,
# max_context 2 holds a one-token prompt and one new token (the warm-up fits it); past the highest a worker
# would try to allocate more than any machine has, or wait longer than any request lives.
_WORKER_RULES = (
    ("max_batch_size", 1, 4096, ""),
    ("max_batched_tokens", 1, 1 << 20, ""),
    ("threads", 0, 1024, " (automatic)"),
    ("decode_threads", 0, 1024, " (automatic)"),
    ("max_context", 2, 1 << 22, ""),
    ("max_queue", 0, 1 << 20, " (no request waits for a row)"),
    ("grammar_compile_timeout_s", 0.001, 3600.0, ""),
)


def _check_worker_fields(spec: EndpointSpec) -> None:
    for field, lowest, highest, meaning in _WORKER_RULES:
        value = getattr(spec, field)
        if not lowest <= value <= highest:
            raise ValueError(f"`{field}` must be between {lowest}{meaning} and {highest} (got {value})")


def _check_scaling(spec: EndpointSpec) -> None:
    if spec.min_replicas < 0:
        raise ValueError(f"`min_replicas` must be 0 (scale to zero) or more (got {spec.min_replicas})")
    if spec.max_replicas < 1:
        raise ValueError(f"`max_replicas` must be at least 1 (got {spec.max_replicas})")
    if spec.min_replicas > spec.max_replicas:
        raise ValueError(f"`min_replicas` ({spec.min_replicas}) must not exceed `max_replicas` ({spec.max_replicas})")
    if not spec.target_concurrency > 0:
        raise ValueError(f"`target_concurrency` must be more than 0 (got {spec.target_concurrency})")
    if spec.max_waiting < 0:
        raise ValueError(f"`max_waiting` must be 0 (no waiting for a replica) or more (got {spec.max_waiting})")
    if not spec.max_wait_seconds > 0:
        raise ValueError(f"`max_wait_seconds` must be more than 0 (got {spec.max_wait_seconds})")


def check_adapter_source(source: str, provisioner: Provisioning) -> None:
    """A LoRA adapter's source is an s3://<bucket>/<prefix> or an absolute path to a PEFT adapter directory (one
    holding adapter_config.json): the rule for the adapters a spec declares and those the admin API registers.
    The directory itself is checked only when the endpoint's workers run on this machine (local provisioning):
    remote workers read their own filesystem."""
    on_this_machine = isinstance(provisioner, LocalProvisioning)
    if source.startswith(S3_SCHEME):
        if len(source) <= len(S3_SCHEME) or source[len(S3_SCHEME):].startswith("/"):
            raise ValueError("must be s3://<bucket>/<prefix>")
        return
    if not Path(source).is_absolute() or (on_this_machine and not (Path(source) / "adapter_config.json").is_file()):
        raise ValueError("must be an absolute path to a PEFT adapter directory (holding adapter_config.json) or an "
                         "s3:// prefix")


def _check_adapters(spec: EndpointSpec) -> None:
    for name, source in spec.adapters.items():
        try:
            check_adapter_source(source, spec.provisioner)
        except ValueError as error:
            raise ValueError(f"`adapters.{name}` {error} (got {source[:200]!r})") from None


def _check_provisioner(provisioner: Provisioning) -> None:
    if isinstance(provisioner, StaticProvisioning):
        if not provisioner.urls:
            raise ValueError("`provisioner.urls` must list at least one worker URL")
        for url in provisioner.urls:
            check_url("provisioner.urls", url)
    elif isinstance(provisioner, EcsProvisioning):
        for field in ("cluster", "service", "region"):
            value = getattr(provisioner, field)
            if not value.strip():
                raise ValueError(f"`provisioner.{field}` must not be empty")
            if not _AWS_ID.fullmatch(value):  # a name or an ARN; part of the fleet's keys (no Redis hash-tag braces)
                raise ValueError(f"`provisioner.{field}` must be an ECS name or ARN: at most {AWS_ID_LIMIT} letters, "
                                 "digits and `-_:/.`")
        if provisioner.endpoint_url:
            check_url("provisioner.endpoint_url", provisioner.endpoint_url)


def check_url(field: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        valid = False
    if not valid:
        raise ValueError(f"`{field}` must hold http(s)://host[:port] URLs (got {url!r})")


def _arn_name(value: str) -> str:
    """A cluster's or service's name, from itself or its ARN (`arn:aws:ecs:<region>:<account>:service/<c>/<name>`)."""
    return value.rsplit("/", 1)[-1] if value.startswith("arn:") else value


def sharing_service(spec: EndpointSpec, others: Iterable[EndpointSpec]) -> EndpointSpec | None:
    """Another endpoint on the same ECS service as `spec`, if any: one endpoint per service (two would scale it as
    two owners, or hand one lease between two names)."""
    return next((o for o in others if o.name != spec.name and o.fleet_key == spec.fleet_key), None)


def service_taken(spec: EndpointSpec, other: EndpointSpec) -> str:
    return (f"the endpoint {other.name!r} already serves the ECS service of {spec.name!r} "
            f"({spec.fleet_key.removeprefix('ecs:')}); one endpoint per service: delete that endpoint first, or "
            "give another service")
