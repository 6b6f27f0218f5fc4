"""SIGTERM while the gateway's lifespan still starts is an ordinary stop (gateway/cli/draining.py): start-up
finishes, the lifespan closes what it opened, and `sluice serve` exits 0, not killed by the signal (-15).

The moment is held open, not guessed: the gateway reaches its database through a door that lets no byte through
until the test opens it, so the signal lands while the lifespan waits for the database."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from testkit.databases import create_database
from testkit.sluice import start_sluice
from tests.fleet.fleet import WAIT_S, until

STATIC = '[[models]]\nname = "remote"\nprovisioner = { kind = "static", urls = ["http://127.0.0.1:9"] }\n'


class HeldDoor:
    """A TCP port in front of `target` that accepts connections at once and relays them only once `opened`."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.knocked = threading.Event()  # someone connected
        self.opened = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):  # the listener closed
            while True:
                client, _ = self.listener.accept()
                self._sockets.append(client)
                self.knocked.set()
                threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        self.opened.wait()
        with suppress(OSError):
            server = socket.create_connection(self.target)
            self._sockets.append(server)
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()
            self._pump(client, server)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self._sockets:
            with suppress(OSError):
                sock.close()


@contextmanager
def held_door(target: tuple[str, int]) -> Iterator[HeldDoor]:
    door = HeldDoor(target)
    try:
        yield door
    finally:
        door.opened.set()
        door.close()


def test_sigterm_during_the_lifespans_start_up_exits_0(postgres, tmp_path):
    url = asyncio.run(create_database(postgres.url, "startstop"))
    host_port, _, name = url.rpartition("@")[2].partition("/")
    host, _, port = host_port.rpartition(":")
    with held_door((host, int(port))) as door:
        held_url = url.replace(f"@{host_port}/", f"@127.0.0.1:{door.port}/")
        config = f'database_url = "{held_url}"\n' + STATIC  # no local worker to spawn: the lifespan alone
        gateway = start_sluice(tmp_path / "gateway", config=config, wait=False)
        try:
            until(door.knocked.is_set, WAIT_S, "the lifespan opening the database")
            gateway.process.send_signal(signal.SIGTERM)
            door.opened.set()
            code = gateway.wait_exit(timeout=WAIT_S)
        finally:
            gateway.stop(signal.SIGKILL)
    assert code == 0, gateway.output[-3000:]
    assert gateway.log_events("gateway_stopped"), gateway.output[-3000:]  # the lifespan closed what it opened
    assert "Traceback" not in gateway.output, gateway.output[-3000:]
