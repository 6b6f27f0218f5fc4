"""A replica's health as the poller sees it: a worker too busy to answer one or two polls in time stays in
rotation; one that stops answering altogether leaves it after the third; one that refuses connections at once."""

from __future__ import annotations

import asyncio

from gateway.replicas.pool import MISSED_POLLS_TOLERATED, ReplicaRouter
from testkit.servers import free_port


async def test_timed_out_polls_are_tolerated_twice_then_the_replica_is_down():
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # a worker stuck: it takes the request and never answers

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    router = ReplicaRouter()
    replica = router.add_replica("m", f"http://127.0.0.1:{port}")
    replica.healthy = True
    try:
        for _ in range(MISSED_POLLS_TOLERATED):
            await replica.poll()
            assert replica.healthy
        await replica.poll()
        assert not replica.healthy
    finally:
        await router.close()
        server.close()


async def test_a_refused_connection_is_down_at_once():
    router = ReplicaRouter()
    replica = router.add_replica("m", f"http://127.0.0.1:{free_port()}")
    replica.healthy = True
    try:
        await replica.poll()
        assert not replica.healthy
    finally:
        await router.close()
