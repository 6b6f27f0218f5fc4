"""ElastiCache IAM authentication for the gateway's Redis clients: the `[redis_iam]` settings, the redis-py
credential provider that signs a short-lived token for each new connection, and `redis_client`, how every
Redis client of the gateway (the limiter, the fleet's shared state) connects and signs in.

With it no Redis password exists anywhere, Terraform state included. The ElastiCache user (authentication mode
`iam`, its name equal to its id) takes as password a SigV4-presigned request `GET http://<cache_name>/?Action=
connect&User=<user>`, signed for the service `elasticache` in the cache's region with the task role's
credentials, valid 15 minutes (ElastiCache checks it at AUTH and HELLO only). redis-py asks the provider at
every new connection, so each one gets a token signed at that moment; ElastiCache closes an IAM-authenticated
connection after 12 hours and the client's next command reconnects with a new token. ElastiCache accepts IAM
tokens over TLS only: `redis_url` is then `rediss://` and names no user or password.
infra/terraform/modules/data makes the user, modules/iam lets the gateway task role `elasticache:Connect`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

import botocore.session
import msgspec
from botocore.auth import SIGV4_TIMESTAMP, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from redis.credentials import CredentialProvider

SERVICE = "elasticache"
TOKEN_LIFETIME_S = 900  # ElastiCache's limit for an IAM token
# ElastiCache user ids and replication group ids: a letter first, then letters, digits and single hyphens, no
# hyphen at the end; lowercase (AWS keeps cache names in lowercase, and the token must name them as they are)
IDENTIFIER = re.compile(r"[a-z](?:-?[a-z0-9])*")
IDENTIFIER_MAX = 40
REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}")


class RedisIamError(ValueError):
    """A `[redis_iam]` that cannot work: its message is the whole line `sluice serve` prints."""


class RedisIamSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `[redis_iam]` table: sign in to ElastiCache as an IAM-authenticated user (off while `user` is "")."""

    user: str = ""  # the ElastiCache user's id (= its name): the Terraform makes "<name>-gateway"
    cache_name: str = ""  # the replication group id the token is signed for (a serverless cache is not supported)
    region: str = ""  # "" = the AWS SDK's own (AWS_DEFAULT_REGION, which ECS sets)

    def __post_init__(self) -> None:
        for field, value in (("user", self.user), ("cache_name", self.cache_name)):
            if value and not (len(value) <= IDENTIFIER_MAX and IDENTIFIER.fullmatch(value)):
                raise ValueError(f"`redis_iam.{field}` must be 1-{IDENTIFIER_MAX} lowercase letters, digits and single "
                                 f"hyphens, starting with a letter and not ending with a hyphen (got {value[:60]!r})")
        if self.region and not REGION.fullmatch(self.region):
            raise ValueError(f"`redis_iam.region` must be an AWS region such as us-east-1 (got {self.region[:60]!r})")
        if not self.user and (self.cache_name or self.region):
            raise ValueError("`redis_iam.cache_name` and `redis_iam.region` need `redis_iam.user` (the ElastiCache "
                             "user to sign in as)")
        if self.user and not self.cache_name:
            raise ValueError("`redis_iam.user` needs `redis_iam.cache_name` (the replication group the token is "
                             "signed for)")


def check_url(settings: RedisIamSettings, redis_url: str) -> None:
    """RedisIamError unless `redis_url` can carry IAM tokens: TLS, and no credentials of its own."""
    if not settings.user:
        return
    if not redis_url:
        raise RedisIamError("redis_iam.user needs redis_url (rediss://<the cache's primary endpoint>:6379/0)")
    parts = urlsplit(redis_url)
    if parts.scheme != "rediss":
        raise RedisIamError(f"redis_iam needs a TLS redis_url (rediss://, got {parts.scheme}://): ElastiCache "
                            "accepts IAM tokens over TLS only")
    if parts.username or parts.password:
        raise RedisIamError("redis_url must name no user or password with redis_iam: the gateway signs in as "
                            "redis_iam.user with a token")


class _SigV4QueryAt(SigV4QueryAuth):
    """botocore's presigning at a given instant (its add_auth stamps the request with the wall clock itself)."""

    def __init__(self, credentials: ReadOnlyCredentials, region: str, at: datetime):
        super().__init__(credentials, SERVICE, region, expires=TOKEN_LIFETIME_S)
        self._at = at

    def add_auth(self, request: AWSRequest) -> None:
        request.context["timestamp"] = self._at.astimezone(UTC).strftime(SIGV4_TIMESTAMP)
        self._modify_request_before_signing(request)
        signature = self.signature(self.string_to_sign(request, self.canonical_request(request)), request)
        self._inject_signature_to_request(request, signature)


def auth_token(credentials: ReadOnlyCredentials, *, user: str, cache_name: str, region: str, at: datetime) -> str:
    """The password of `user` on `cache_name` for 15 minutes from `at`: the presigned request without its scheme."""
    request = AWSRequest(method="GET", url=f"http://{cache_name}/?Action=connect&User={quote(user, safe='')}")
    _SigV4QueryAt(credentials, region, at).add_auth(request)
    return request.url.removeprefix("http://")


def _now() -> datetime:
    return datetime.now(UTC)


def redis_client(url: str, *, timeout: float, credentials: CredentialProvider | None,
                 max_connections: int | None = None):
    """A gateway Redis client (redis.asyncio): connect and read timeouts of `timeout` s; `credentials` asked at
    each new connection (an IAM token; None: the URL's own user and password, if any); one quick reconnect on a
    connection error, so a pooled connection the server closed (a restart; ElastiCache ends IAM-authenticated
    connections after 12 hours) is replaced, with a new token, rather than failing the call. A read timeout is
    never retried: the command may have run, and the callers' scripts must not run twice for one."""
    import redis.asyncio as aioredis  # only where Redis is configured
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                   max_connections=max_connections, credential_provider=credentials,
                                   retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
                                   retry_on_timeout=False)


class IamCredentialProvider(CredentialProvider):
    """What redis-py asks at each new connection: (user, a token signed now with the credentials of now)."""

    def __init__(self, settings: RedisIamSettings, *, session: botocore.session.Session | None = None,
                 clock: Callable[[], datetime] = _now):
        """RedisIamError when there is no region or no AWS credentials to sign with. Resolving the credentials
        may call the ECS credentials endpoint: build it off the event loop."""
        session = session or botocore.session.get_session()
        self.user = settings.user
        self.cache_name = settings.cache_name
        self.region = settings.region or session.get_config_variable("region") or ""
        if not self.region:
            raise RedisIamError("cannot sign Redis IAM tokens without a region: set redis_iam.region (or "
                                "AWS_DEFAULT_REGION, which ECS sets)")
        self._credentials = session.get_credentials()
        if self._credentials is None:
            raise RedisIamError("no AWS credentials to sign Redis IAM tokens with: run with a task role (ECS) or "
                                "AWS_ACCESS_KEY_ID / AWS_PROFILE, or unset redis_iam.user")
        self._clock = clock

    def get_credentials(self) -> tuple[str, str]:
        # frozen: one consistent key, secret and session token, refreshed by botocore before the role's expire
        credentials = self._credentials.get_frozen_credentials()
        return self.user, auth_token(credentials, user=self.user, cache_name=self.cache_name, region=self.region,
                                     at=self._clock())

    async def get_credentials_async(self) -> tuple[str, str]:
        # a refresh of the task role's credentials is an HTTP call: off the event loop
        return await asyncio.to_thread(self.get_credentials)
