"""Servers that serve at once (ParameterServerStrategy): the chief waits until each listens, then watches them.

Real sockets on 127.0.0.1 play the servers: one that comes late, one that never comes, one whose process
"dies" (its listening socket and connections close), one that only drops an idle connection, and one that
comes back on the same port. No ML framework.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import pytest

from entrypoint.cluster.environments import resolve
from entrypoint.cluster.environments.settings import PlatformSettings
from entrypoint.cluster.topology import Peer
from entrypoint.errors import ConfigError, PeerError
from entrypoint.lifecycle.startup import rendezvous
from entrypoint.lifecycle.startup.listening import ServerWatch, wait_until_listening
from entrypoint.options import RunOptions
from entrypoint.planning.plan import Plan, make_plan


class Server:
    """A TCP server on 127.0.0.1 that accepts and keeps connections until told to die or drop them."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def peer(self) -> Peer:
        return Peer("workerpool2[0]", f"127.0.0.1:{self.port}")

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)

    def drop_connections(self) -> None:
        """Close every accepted connection but keep listening (gRPC's idle handshake timeout)."""
        for conn in self.conns:
            conn.close()
        self.conns.clear()

    def die(self) -> None:
        """Close everything, as a SIGKILLed process's sockets are (again: nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.drop_connections()
        self.sock.close()


def until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Until ``condition()`` holds (the watch looks every 0.05 s: an event, waited for on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_chief_waits_for_a_server_that_comes_late() -> None:
    port = free_port()
    servers: list[Server] = []
    timer = threading.Timer(1.0, lambda: servers.append(Server(port)))
    timer.start()
    started = time.monotonic()
    try:
        wait_until_listening([Peer("workerpool2[0]", f"127.0.0.1:{port}")], timeout=30)
    finally:
        timer.join()
        for s in servers:
            s.die()
    assert 0.9 < time.monotonic() - started < 25  # within the 30 s --timeout


def test_a_server_that_never_listens_is_named_at_the_timeout() -> None:
    port = free_port()
    with pytest.raises(PeerError, match=rf"^gave up after 1 s \(--timeout\) waiting for 1 of 1 servers to listen: "
                                        rf"workerpool1\[0\] \(127.0.0.1:{port}\)$"):
        wait_until_listening([Peer("workerpool1[0]", f"127.0.0.1:{port}")], timeout=1)


def test_a_dead_server_is_lost_and_blamed_for_the_framework_error() -> None:
    server = Server()
    with ServerWatch([server.peer], poll=0.05) as watch:
        until(lambda: server.conns, "the watch connected")
        assert watch.lost() == []
        watch.blame(RuntimeError("nothing wrong with the servers"))  # no loss: the error stays the user's
        server.die()
        [lost] = watch.lost()  # seen at once, without waiting for the thread's next look
        assert lost.peer == server.peer and "refused" in lost.why
        with pytest.raises(PeerError, match=r"lost workerpool2\[0\] \(127\.0\.0\.1:\d+\) .* during training "
                                            r"\(the framework then failed with OutOfRangeError\)"):
            watch.blame(type("OutOfRangeError", (Exception,), {})("End of sequence"))
        watch.blame(ConfigError("--x", "bad"))  # the entrypoint's own errors keep their class


def test_an_idle_connection_dropped_by_a_live_server_is_not_a_loss() -> None:
    server = Server()
    try:
        with ServerWatch([server.peer], poll=0.05) as watch:
            until(lambda: server.conns, "the watch connected")
            server.drop_connections()
            until(lambda: server.conns, "the watch dialled again")  # it noticed the drop and looked again
            assert watch.lost() == []
    finally:
        server.die()


def test_a_server_restarted_on_its_port_is_lost_once_and_watched_again() -> None:
    server = Server()
    with ServerWatch([server.peer], poll=0.05) as watch:
        port = server.port
        until(lambda: server.conns, "the watch connected")
        server.die()
        until(lambda: len(watch.lost()) == 1, "the loss seen")
        back = Server(port)
        try:
            until(lambda: back.conns, "the watch holds a connection to the new process")
            assert len(watch.lost()) == 1  # lost once, not again while it was away
            back.die()
            until(lambda: len(watch.lost()) == 2, "the new process watched too")
        finally:
            back.die()


def test_a_server_not_listening_when_training_starts_is_lost() -> None:
    peer = Peer("workerpool1[0]", f"127.0.0.1:{free_port()}")
    with ServerWatch([peer]) as watch:
        [lost] = watch.lost()
    assert "not listening when training started" in lost.why


def ps_plan(pool: str, chief_port: int, server_ports: tuple[int, int], script: str | None = None) -> Plan:
    cluster = {"workerpool0": [f"127.0.0.1:{chief_port}"], "workerpool1": [f"127.0.0.1:{server_ports[0]}"],
               "workerpool2": [f"127.0.0.1:{server_ports[1]}"]}
    spec = {"cluster": cluster, "environment": "cloud", "task": {"type": pool, "index": 0}, "job": {}}
    code = {"script": script} if script else {"module": "tests.tensorflow.toy_hooks"}
    return make_plan(resolve({"CLUSTER_SPEC": json.dumps(spec)}),
                     RunOptions(framework="tensorflow", timeout=20, **code), PlatformSettings(), 0)


def test_parameter_server_replicas_serve_at_once_without_the_chief() -> None:
    """A ps or PS worker restarted mid-job must serve again while the chief trains: it waits for nobody."""
    for pool in ("workerpool1", "workerpool2"):
        plan = ps_plan(pool, free_port(), (free_port(), free_port()))
        assert plan.peers_serve
        started = time.monotonic()
        rendezvous.meet_peers(plan)
        assert time.monotonic() - started < 10  # not the plan's 20 s --timeout


def test_the_parameter_server_chief_waits_until_its_servers_listen(caplog: pytest.LogCaptureFixture) -> None:
    """The servers start late (the ps after the worker): the chief waits for both, naming the one still missing."""
    worker_port, ps_port = free_port(), free_port()
    servers: list[Server] = []
    late = [threading.Timer(0.5, lambda: servers.append(Server(worker_port))),
            threading.Timer(1.5, lambda: servers.append(Server(ps_port)))]
    caplog.set_level("INFO", logger="entrypoint")
    started = time.monotonic()
    for timer in late:
        timer.start()
    try:
        rendezvous.meet_peers(ps_plan("workerpool0", free_port(), (worker_port, ps_port)))
        waited = time.monotonic() - started
        assert len(servers) == 2, "the chief went on before both servers listened"
    finally:
        for timer in late:
            timer.join()
        for server in servers:
            server.die()
    assert 1.4 < waited < 15
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert said and said[0].startswith("waiting for 2 of 2 workers and parameter servers to listen: workerpool1[0]")
    assert f"workerpool2[0] (127.0.0.1:{ps_port})" in said[-1]


def test_a_parameter_server_script_starts_its_own_servers_so_its_chief_does_not_wait() -> None:
    """A script's ps and workers may serve or not (TensorFlow's strategy waits for them, as on the platform)."""
    plan = ps_plan("workerpool0", free_port(), (free_port(), free_port()), script="tests/jobspecs/who_am_i.py")
    started = time.monotonic()
    rendezvous.meet_peers(plan)
    assert time.monotonic() - started < 10  # not the plan's 20 s --timeout
