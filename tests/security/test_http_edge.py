"""Network ↔ gateway: what one connection may hold before the app sees its request (`[http]` settings,
gateway/edge/http_limits.py), through the real `sluice serve` in front of the stub worker.

Raw sockets play the hostile clients: half-sent heads that stall, heads that trickle in, heads of megabytes,
bodies that never finish, one address opening connection after connection. Other clients keep being served
meanwhile. Every wait is bounded, so a gateway that holds a connection forever fails instead of hanging.

A second gateway (`buffers`) has a long body timeout, so stalled bodies stay: what bounds them there is the
bytes of unfinished bodies held per client and in all, and behind a trusted proxy (the ALB case) the requests
in progress of each forwarded client, an IPv6 client counted by its /64."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from testkit.admin import team_key
from testkit.protocol_worker import worker_process
from testkit.sluice import running_sluice
from testkit.stub_gateway import ADMIN_KEY, footprint, host_port
from tests.faults.load import MODEL

HEADER_TIMEOUT_S = 4.0
BODY_TIMEOUT_S = 2.0
MAX_HEADER_BYTES = 8192
PER_CLIENT = 20
PROXY = "127.0.0.4"  # a trusted proxy: its own connections are not capped
CONFIG = f"""log_format = "json"
trusted_proxies = ["{PROXY}"]
default_team_limits = {{}}
[http]
header_timeout_s = {HEADER_TIMEOUT_S}
body_timeout_s = {BODY_TIMEOUT_S}
max_header_bytes = {MAX_HEADER_BYTES}
max_connections_per_client = {PER_CLIENT}
keep_alive_timeout_s = 60
[[models]]
name = "{MODEL}"
provisioner = {{ kind = "static", urls = ["{{url}}"] }}
"""
HALF_OPEN = 1000
# 50 source addresses x 20: the flood stays under the per-address cap, so the gateway really holds it
FLOOD_ADDRESSES = [f"127.0.1.{i}" for i in range(1, HALF_OPEN // PER_CLIENT + 1)]
CUT_WITHIN_S = HEADER_TIMEOUT_S + 20  # generous: two shared cores; what fails is a connection held for good
PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\nx-slow: "


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 8192)  # the flood's sockets here, and the gateway (which inherits it) accepting them
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        with worker_process(token_delay=0.001) as stub, \
                running_sluice(tmp_path_factory.mktemp("edge"), config=CONFIG.replace("{url}", stub.url),
                               env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as sluice:
            yield sluice
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect(server, source: str = "127.0.0.1", timeout: float = 30.0) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(host_port(server))
    return sock


def read_until_closed(sock: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after `within`."""
    deadline = time.monotonic() + within
    data = b""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the connection is still open after {within} s (got {data[:200]!r})"
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def answer(data: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


def complete(server, source: str = "127.0.0.1") -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        return client.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4},
                           headers={"authorization": f"Bearer {server.api_key}"})


@contextlib.contextmanager
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def test_a_thousand_half_open_connections_are_cut_while_a_valid_client_is_served(server):
    before = footprint(server)
    with sockets() as flood:
        for index in range(HALF_OPEN):
            sock = connect(server, FLOOD_ADDRESSES[index % len(FLOOD_ADDRESSES)])
            sock.sendall(PARTIAL_HEAD)
            flood.append(sock)
        deadline = time.monotonic() + 10
        while footprint(server)[1] < before[1] + HALF_OPEN and time.monotonic() < deadline:
            time.sleep(0.05)  # until the gateway has taken them all
        served = [complete(server).status_code for _ in range(5)]  # while the flood is held
        answers = [read_until_closed(sock, CUT_WITHIN_S) for sock in flood]
    assert served == [200] * 5
    statuses = {answer(data)[0] for data in answers}
    assert statuses == {408}, statuses
    assert answer(answers[0])[2]["error"]["code"] == "header_timeout"
    assert complete(server).status_code == 200
    deadline = time.monotonic() + 30
    while footprint(server)[1] > before[1] + 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert footprint(server)[1] <= before[1] + 10  # every descriptor of the flood was given back


def test_a_head_that_trickles_in_is_cut_at_the_header_timeout(server):
    with sockets() as held:
        sock = connect(server, "127.0.0.5")
        held.append(sock)
        sock.sendall(PARTIAL_HEAD)
        started = time.monotonic()
        cut = False
        while not cut and time.monotonic() - started < CUT_WITHIN_S:  # a byte every 0.2 s: progress, never a head
            sock.settimeout(0.2)
            try:
                sock.recv(1, socket.MSG_PEEK)  # the answer, or the end of the connection
                cut = True
            except TimeoutError:
                try:
                    sock.sendall(b"a")
                except (BrokenPipeError, ConnectionResetError):
                    cut = True
            except ConnectionResetError:
                cut = True
        assert cut, "a head that kept trickling in was held past the header timeout"
        data = read_until_closed(sock, CUT_WITHIN_S)
        if data:  # (a reset may overtake the answer)
            status, _, body = answer(data)
            assert status == 408 and "header_timeout_s" in body["error"]["message"]


def test_the_next_request_on_a_kept_alive_connection_has_the_same_header_timeout(server):
    with sockets() as held:
        sock = connect(server, "127.0.0.10")
        held.append(sock)
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: sluice\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        sock.sendall(PARTIAL_HEAD)  # the next request starts and stalls
        status, _, body = answer(read_until_closed(sock, CUT_WITHIN_S))
    assert status == 408 and body["error"]["code"] == "header_timeout"


def test_a_silent_connection_is_closed_without_an_answer(server):
    with sockets() as held:
        sock = connect(server, "127.0.0.6")
        held.append(sock)
        assert read_until_closed(sock, CUT_WITHIN_S) == b""


def test_a_body_that_stalls_is_cut_at_the_body_timeout(server):
    body = json.dumps({"model": MODEL, "prompt": "hi " * 200, "max_tokens": 4}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer {server.api_key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    with sockets() as held:
        sock = connect(server, "127.0.0.7")
        held.append(sock)
        sock.sendall(head + body[:100])  # and never the rest
        status, _, error = answer(read_until_closed(sock, CUT_WITHIN_S))
    assert status == 408 and error["error"]["code"] == "body_timeout"
    assert complete(server, "127.0.0.7").status_code == 200
    # the app heard a client gone mid-body: a refusal in its log, not a fault with a traceback
    assert not server.log_events("unhandled_error")
    cut = server.log_events_once("request_done", lambda found: any(e["http_status"] == 408 for e in found))
    assert {(e["status"], e["error"]) for e in cut if e["http_status"] == 408} == {("rejected", "body_incomplete")}


def head_with(extra: int) -> bytes:
    return (f"GET /health HTTP/1.1\r\nhost: sluice\r\nx-pad: {'p' * extra}\r\n\r\n").encode()


def test_an_oversized_head_gets_431_in_one_read_or_many(server):
    with sockets() as held:
        whole = connect(server, "127.0.0.8")  # the whole head at once, complete: measured exactly
        held.append(whole)
        whole.sendall(head_with(MAX_HEADER_BYTES + 100))
        status, headers, body = answer(read_until_closed(whole, CUT_WITHIN_S))
        assert status == 431 and headers["connection"] == "close"
        assert body["error"]["code"] == "header_too_large" and str(MAX_HEADER_BYTES) in body["error"]["message"]
        endless = connect(server, "127.0.0.8")  # a head that never ends: refused once past the bound
        held.append(endless)
        endless.sendall(b"GET /health HTTP/1.1\r\nx-pad: " + b"p" * (4 * MAX_HEADER_BYTES))
        assert answer(read_until_closed(endless, CUT_WITHIN_S))[0] == 431
        fits = connect(server, "127.0.0.8")
        held.append(fits)
        fits.sendall(head_with(MAX_HEADER_BYTES - 200))
        fits.settimeout(30)
        assert fits.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_a_large_body_behind_a_small_head_is_not_taken_for_a_large_head(server):
    # the body arrives in the same reads as the head: only the head counts against max_header_bytes
    prompt = "hello " * 100_000
    response = httpx.post(f"{server.url}/v1/completions", timeout=60,
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
                          headers={"authorization": f"Bearer {server.api_key}"})
    assert response.status_code not in (408, 431), response.text


def test_megabyte_heads_leave_the_gateway_memory_alone(server):
    # the attack: three 30 MB headers took the gateway from 165 to 307 MB resident
    before = footprint(server)[0]

    def send() -> None:
        with contextlib.suppress(OSError), contextlib.closing(connect(server, "127.0.0.9")) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nx-pad: " + b"p" * (30 << 20))

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=60)
    assert not any(sender.is_alive() for sender in senders), "a 30 MB head was still being taken after 60 s"
    growth = (footprint(server)[0] - before) >> 20
    assert growth < 24, f"the gateway grew {growth} MiB"  # each head was refused past its first read


def test_one_address_gets_its_share_of_connections_and_no_more(server):
    request = b"GET /health HTTP/1.1\r\nhost: sluice\r\n\r\n"
    with sockets() as held:
        for _ in range(PER_CLIENT):  # each answered, then idle in keep-alive (held up to 60 s)
            sock = connect(server, "127.0.0.2")
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            held.append(sock)
        excess = connect(server, "127.0.0.2")
        held.append(excess)
        status, headers, body = answer(read_until_closed(excess, CUT_WITHIN_S))
        assert status == 429 and body["error"]["code"] == "too_many_connections" and "retry-after" in headers
        assert complete(server, "127.0.0.3").status_code == 200  # another address is served meanwhile
        for _ in range(PER_CLIENT + 5):  # a trusted proxy carries many clients: not capped
            sock = connect(server, PROXY)
            sock.sendall(request)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            held.append(sock)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the closed ones are given back to their address
        if complete(server, "127.0.0.2").status_code == 200:
            break
        time.sleep(0.2)
    assert complete(server, "127.0.0.2").status_code == 200



BODY_TIMEOUT_LONG_S = 120.0  # the stalled bodies stay unless a bound cuts them
BUFFERED = 16 << 20
BUFFERED_PER_CLIENT = 4 << 20
STALLED = 100
STALLED_BYTES = 3_800_000  # the figure: 3.8 MB of a 4 MB body, then nothing
BUFFERS_CONFIG = f"""log_format = "json"
trusted_proxies = ["{PROXY}"]
default_team_limits = {{}}
[http]
body_timeout_s = {BODY_TIMEOUT_LONG_S}
max_connections_per_client = {PER_CLIENT}
max_buffered_body_bytes = {BUFFERED}
max_buffered_body_bytes_per_client = {BUFFERED_PER_CLIENT}
keep_alive_timeout_s = 60
[[models]]
name = "{MODEL}"
provisioner = {{ kind = "static", urls = ["{{url}}"] }}
"""


@pytest.fixture(scope="module")
def buffers(tmp_path_factory):
    with worker_process(token_delay=0.001) as stub, \
            running_sluice(tmp_path_factory.mktemp("buffers"), config=BUFFERS_CONFIG.replace("{url}", stub.url),
                           env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as sluice:
        yield sluice


@pytest.fixture
def attacker(buffers) -> str:
    """A key of its own for a test's stalled bodies: each cut body counts against its key's rejection budget, and
    a hundred spend it (the key is then refused whole for the minute: gateway/serving/rejections.py)."""
    return team_key(buffers, f"stalling-{uuid.uuid4().hex[:12]}")


def stall_body(server, key: str, source: str, forwarded: str | None = None, size: int = STALLED_BYTES) -> socket.socket:
    """A completion whose head says 4,000,000 bytes of body and whose body stops after `size` of them."""
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer {key}\r\n"
            f"content-type: application/json\r\ncontent-length: 4000000\r\n"
            + (f"x-forwarded-for: {forwarded}\r\n" if forwarded else "") + "\r\n").encode()
    sock = connect(server, source)
    with contextlib.suppress(OSError):  # a connection cut while it sends
        sock.sendall(head + b" " * size)
    return sock


def answered(sock: socket.socket, within: float = 0.5) -> int | None:
    """The status the server answered on `sock` (cut), or None while it holds the connection."""
    sock.settimeout(within)
    try:
        data = sock.recv(65536)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return 0
    return answer(data)[0] if data else 0


def test_a_hundred_stalled_bodies_hold_a_bounded_memory_while_another_client_is_served(buffers, attacker):
    # the attack: 100 connections, 3.8 MB of body each, then silence (RSS 140 -> 520 MiB)
    before = footprint(buffers)[0]
    with sockets() as held:
        for index in range(STALLED):
            held.append(stall_body(buffers, attacker, f"127.0.2.{index + 1}"))
        growth = (footprint(buffers)[0] - before) >> 20
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.3.1"), timeout=60) as client:
            honest = client.post(f"{buffers.url}/v1/completions", json={"model": MODEL, "prompt": "hi " * 300_000,
                                 "max_tokens": 2}, headers={"authorization": f"Bearer {buffers.api_key}"})
        statuses = [answered(sock) for sock in held]
    assert honest.status_code == 200, honest.text[:300]
    assert growth < 100, f"the gateway grew {growth} MiB holding {STALLED} stalled bodies"
    assert statuses.count(429) >= STALLED // 2, statuses  # cut, the largest holder first


def test_one_client_holds_at_most_its_share_of_unfinished_bodies(buffers, attacker):
    with sockets() as held:
        first = stall_body(buffers, attacker, "127.0.4.1")
        held.append(first)
        second = stall_body(buffers, attacker, "127.0.4.1")  # 3.8 + 3.8 MB > the client's 4 MiB
        held.append(second)
        status, headers, body = answer(read_until_closed(second, CUT_WITHIN_S))
        assert status == 429 and body["error"]["code"] == "body_buffer_full" and "retry-after" in headers
        assert answered(first) is None  # the one within its share is still being read
        assert complete(buffers, "127.0.4.2").status_code == 200
    assert not buffers.log_events("unhandled_error")


def test_clients_behind_the_trusted_proxy_are_capped_by_their_forwarded_address(buffers, attacker):
    # the ALB case: one peer address carries every client; each forwarded client gets its share of requests
    for client, others in (("198.51.100.7", "198.51.100.8"),
                           ("2001:db8:7:7::{}", "2001:db8:7:8::1")):  # IPv6: one /64, many addresses
        with sockets() as held:
            for index in range(PER_CLIENT):
                held.append(stall_body(buffers, attacker, PROXY, client.format(index + 1), size=10))
            excess = stall_body(buffers, attacker, PROXY, client.format(PER_CLIENT + 1), size=10)
            held.append(excess)
            status, _, body = answer(read_until_closed(excess, CUT_WITHIN_S))
            assert status == 429 and body["error"]["code"] == "too_many_connections", (client, body)
            transport = httpx.HTTPTransport(local_address=PROXY)
            with httpx.Client(transport=transport, timeout=30) as proxied:
                other = proxied.post(f"{buffers.url}/v1/completions", headers={
                    "authorization": f"Bearer {buffers.api_key}", "x-forwarded-for": others},
                    json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
            assert other.status_code == 200, other.text


def test_failed_logins_from_one_ipv6_64_share_one_throttle(buffers):
    # every address of a /64 is one client: a guesser rotating through its own /64 meets the throttle
    transport = httpx.HTTPTransport(local_address=PROXY)
    with httpx.Client(transport=transport, timeout=30) as proxied:
        statuses = [proxied.get(f"{buffers.url}/v1/models", headers={
            "authorization": "Bearer sk-sluice-000000000000-wrong", "x-forwarded-for": f"2001:db8:9:9::{index:x}"})
            .status_code for index in range(1, 62)]  # the default rejections_per_minute, 60, then one more
        other = proxied.get(f"{buffers.url}/v1/models", headers={
            "authorization": "Bearer sk-sluice-000000000000-wrong", "x-forwarded-for": "2001:db8:9:a::1"})
    assert statuses[:60] == [401] * 60 and statuses[-1] == 429, statuses
    assert other.status_code == 401  # the next /64 is another client


@pytest.mark.parametrize(("spellings", "other"), [
    (["2001:db8:7:7::1", "2001:DB8:7:7:ffff:ffff:ffff:ffff", "2001:0db8:0007:0007:0:0:0:2", "[2001:db8:7:7::3]",
      "[2001:db8:7:7::4]:50123"], "2001:db8:7:8::1"),  # one /64, however written (a proxy may add brackets, a port)
    (["198.51.100.7", "::ffff:198.51.100.7", "::ffff:c633:6407", "198.51.100.7:50123", " 198.51.100.7 "],
     "198.51.100.8"),  # an IPv4 client, also through a dual-stack socket or with the port a proxy appended
])
def test_a_client_is_its_address_or_its_64_however_it_is_written(spellings, other):
    from auth.forwarded import client_group

    assert len({client_group(s) for s in spellings}) == 1, [client_group(s) for s in spellings]
    assert client_group(other) != client_group(spellings[0])
