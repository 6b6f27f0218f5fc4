"""ElastiCache IAM authentication (gateway/redis_iam.py): the token is botocore's presigned `connect` request;
the gateway's Redis clients (the limiter, the fleet state) sign in as the IAM user with it, against a real
redis-server that speaks TLS only and has its default user off, as ElastiCache does; each new connection gets a
token signed at that moment; every `[redis_iam]` rule is one line at start."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl

import botocore.auth
import botocore.session
import pytest
import redis
import redis.asyncio as aioredis
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials
from litestar.testing import AsyncTestClient
from redis.exceptions import AuthenticationError

from gateway.config import load_settings
from gateway.edge.app import create_app
from gateway.edge.lifespan import STATE_FAILURE
from gateway.endpoints.fleet import RedisFleet, Report
from gateway.limits import open_limiter
from gateway.limits.scope import LimitScope
from gateway.redis_iam import IamCredentialProvider, RedisIamSettings, auth_token
from testkit.servers import TlsRedisServer, tls_redis_server
from tests.gateway.app_client import app_client
from tests.infra.terraform import TERRAFORM_SOURCE

USER = "sluice-test-gateway"
SETTINGS = RedisIamSettings(user=USER, cache_name="sluice-test", region="eu-west-1")
CREDENTIALS = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session/token+with=odd")
SIGNED_AT = datetime(2026, 11, 27, 2, 40, 5, tzinfo=UTC)
ADMIN_PASSWORD = "redis-admin-password-for-the-tests"
# the gateway user's access string in the Terraform (modules/data): the clients must work with exactly that
ACCESS = re.search(r'cache_access = "([^"]+)"',
                   (TERRAFORM_SOURCE / "modules" / "data" / "databases.tf").read_text()).group(1).split()


def botocore_presigned(credentials: ReadOnlyCredentials, at: datetime) -> str:
    """What botocore's own presigning (its add_auth, on its clock frozen at `at`) makes of the connect request."""
    request = AWSRequest(method="GET", url="http://sluice-test/", params={"Action": "connect", "User": USER})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(botocore.auth, "get_current_datetime", lambda *_: at.astimezone(UTC).replace(tzinfo=None))
        SigV4QueryAuth(credentials, "elasticache", "eu-west-1", expires=900).add_auth(request)
    return request.url.removeprefix("http://")


def test_the_token_is_the_presigned_connect_request_valid_15_minutes():
    token = auth_token(CREDENTIALS, user=USER, cache_name="sluice-test", region="eu-west-1", at=SIGNED_AT)
    assert token == botocore_presigned(CREDENTIALS, SIGNED_AT)  # the signature recomputed
    host, _, query = token.partition("/?")
    params = dict(parse_qsl(query))
    assert host == "sluice-test" and params["Action"] == "connect" and params["User"] == USER
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256" and params["X-Amz-SignedHeaders"] == "host"
    assert params["X-Amz-Credential"] == "AKIDEXAMPLE/20261127/eu-west-1/elasticache/aws4_request"
    assert params["X-Amz-Security-Token"] == CREDENTIALS.token
    signed = datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert signed == SIGNED_AT and signed + timedelta(seconds=int(params["X-Amz-Expires"])) == SIGNED_AT + timedelta(
        minutes=15)
    other = ReadOnlyCredentials(CREDENTIALS.access_key, "another-secret", CREDENTIALS.token)
    assert dict(parse_qsl(auth_token(other, user=USER, cache_name="sluice-test", region="eu-west-1",
                                     at=SIGNED_AT).partition("/?")[2]))["X-Amz-Signature"] != params["X-Amz-Signature"]


@pytest.fixture(scope="module")
def tls_redis():
    """TLS only, the default user off (no client gets in without signing in), an admin user for the tests."""
    with tls_redis_server() as server:
        setup = redis.Redis.from_url(server.url)
        setup.execute_command("ACL", "SETUSER", "admin", "on", f">{ADMIN_PASSWORD}", "~*", "&*", "+@all")
        setup.execute_command("ACL", "SETUSER", "default", "off")
        setup.close()
        yield server


@pytest.fixture
async def admin(tls_redis: TlsRedisServer):
    client = aioredis.Redis.from_url(tls_redis.url, username="admin", password=ADMIN_PASSWORD)
    yield client
    await client.execute_command("ACL", "DELUSER", USER)
    await client.aclose()


async def signed_in_users(admin: aioredis.Redis) -> list[str]:
    """The user of every connection but the admin's own."""
    own = await admin.client_id()
    return [client["user"] for client in await admin.client_list() if int(client["id"]) != own]


def static_session(credentials: ReadOnlyCredentials) -> botocore.session.Session:
    session = botocore.session.Session()
    session.set_credentials(credentials.access_key, credentials.secret_key, credentials.token)
    return session


Call = tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]  # (one call through Redis, close)


def limiter_call(url: str, signer: IamCredentialProvider) -> Call:
    limiter = open_limiter(url, credentials=signer)

    async def call():
        await limiter.settle(await limiter.admit([LimitScope(id="redis-iam", rpm=1000)], 0), 0)
    return call, limiter.close


def fleet_call(url: str, signer: IamCredentialProvider) -> Call:
    fleet = RedisFleet(url, credentials=signer)

    async def call():
        await fleet.sync("redis-iam", Report(demand=1.0), 5.0, 5.0)
    return call, fleet.close


@pytest.mark.parametrize("client", [limiter_call, fleet_call], ids=["limiter", "fleet"])
async def test_each_new_connection_signs_in_with_a_token_signed_at_that_moment(tls_redis, admin, client):
    now = [SIGNED_AT]
    signer = IamCredentialProvider(SETTINGS, session=static_session(CREDENTIALS), clock=lambda: now[0])
    first = botocore_presigned(CREDENTIALS, now[0])
    # the IAM user's password is exactly the token botocore computes: no other one signs in
    await admin.execute_command("ACL", "SETUSER", USER, "reset", f">{first}", *ACCESS)
    call, close = client(tls_redis.url, signer)
    try:
        await call()
        assert set(await signed_in_users(admin)) == {USER}
        now[0] = SIGNED_AT + timedelta(minutes=16)  # the first token has expired
        fresh = botocore_presigned(CREDENTIALS, now[0])
        await admin.execute_command("ACL", "SETUSER", USER, "resetpass", f">{fresh}")
        await admin.execute_command("CLIENT", "KILL", "USER", USER)  # ElastiCache's end of a connection
        await call()  # on a new connection, which signs in with the fresh token
        assert set(await signed_in_users(admin)) == {USER}
    finally:
        await close()
    stale = aioredis.Redis.from_url(tls_redis.url, username=USER, password=first)
    with pytest.raises(AuthenticationError):  # the server checks the token: the first one no longer signs in
        await stale.ping()
    await stale.aclose()


async def test_the_gateway_signs_in_to_redis_as_the_iam_user(gateway_settings, tls_redis, admin, monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"), ("AWS_SECRET_ACCESS_KEY", "secret"),
                        ("AWS_DEFAULT_REGION", "eu-west-1")):
        monkeypatch.setenv(name, value)
    # nopass: any password signs in, so what this shows is the user name and that every connection sends AUTH
    await admin.execute_command("ACL", "SETUSER", USER, "reset", "nopass", *ACCESS)
    gateway_settings.redis_url = tls_redis.url
    gateway_settings.redis_iam = RedisIamSettings(user=USER, cache_name="sluice-test")
    async with app_client(gateway_settings) as client:
        refused = await client.get("/v1/models", headers={"authorization": "Bearer sk-not-a-key"})
        assert refused.status_code == 401  # counted against the client address, in Redis
        users = await signed_in_users(admin)
    assert users and set(users) == {USER}


@pytest.mark.parametrize(("environment", "words"), [
    ({"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}, ["without a region", "redis_iam.region"]),
    ({"AWS_DEFAULT_REGION": "eu-west-1"}, ["no AWS credentials", "redis_iam.user"]),
])
async def test_no_region_or_no_credentials_stops_the_start_with_one_line(gateway_settings, monkeypatch, environment,
                                                                         words):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    gateway_settings.redis_url = "rediss://127.0.0.1:9/0"
    gateway_settings.redis_iam = RedisIamSettings(user=USER, cache_name="sluice-test")
    app = create_app(gateway_settings, supervise=False)
    with pytest.raises(ExceptionGroup):  # the lifespan's StartupError, through the test client's task group
        async with AsyncTestClient(app=app):
            pass
    failure = app.state[STATE_FAILURE]
    assert "\n" not in failure and all(word in failure for word in words), failure


IAM = '[redis_iam]\nuser = "sluice-test-gateway"\ncache_name = "sluice-test"\n'


@pytest.mark.parametrize(("config", "words"), [
    ('[redis_iam]\nuser = "Sluice_Gateway"\ncache_name = "sluice-test"', ["redis_iam.user", "lowercase"]),
    (f'[redis_iam]\nuser = "{"a" * 41}"\ncache_name = "sluice-test"', ["redis_iam.user", "1-40"]),
    ('[redis_iam]\nuser = "sluice--gateway"\ncache_name = "sluice-test"', ["redis_iam.user"]),
    ('[redis_iam]\nuser = "sluice-gateway"\ncache_name = "sluice-test-"', ["redis_iam.cache_name", "hyphen"]),
    ('[redis_iam]\nuser = "sluice-gateway"', ["needs `redis_iam.cache_name`"]),
    ('[redis_iam]\ncache_name = "sluice-test"', ["need `redis_iam.user`"]),
    ('[redis_iam]\nregion = "eu-west-1"', ["need `redis_iam.user`"]),
    (IAM + 'region = "EU_WEST_1"', ["redis_iam.region", "us-east-1"]),
    (IAM + 'password = "x"', ["password"]),
    (IAM, ["needs redis_url", "rediss://"]),
    ('redis_url = "redis://cache:6379/0"\n' + IAM, ["TLS", "rediss://"]),
    ('redis_url = "rediss://:hunter2@cache:6379/0"\n' + IAM, ["no user or password"]),
    ('redis_url = "rediss://default@cache:6379/0"\n' + IAM, ["no user or password"]),
])
def test_a_bad_redis_iam_table_is_one_line(monkeypatch, config, words):
    monkeypatch.setenv("SLUICE_CONFIG_TOML", config + "\n")
    with pytest.raises(SystemExit) as failure:
        load_settings()
    message = str(failure.value)
    assert message.startswith("sluice: ") and "\n" not in message and all(w in message for w in words), message
    assert "hunter2" not in message


def test_redis_iam_from_the_environment(monkeypatch):
    for name, value in (("SLUICE_REDIS_URL", "rediss://sluice-prod.abc123.euw1.cache.amazonaws.com:6379/0"),
                        ("SLUICE_REDIS_IAM__USER", "sluice-prod-gateway"),
                        ("SLUICE_REDIS_IAM__CACHE_NAME", "sluice-prod"), ("SLUICE_REDIS_IAM__REGION", "eu-west-1")):
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.redis_iam == RedisIamSettings(user="sluice-prod-gateway", cache_name="sluice-prod",
                                                  region="eu-west-1")
