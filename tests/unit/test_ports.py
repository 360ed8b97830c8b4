"""Ports a launcher hands out: free, below the ephemeral range, and never one that another launcher on this host
picked lately (it may not have bound it yet: two jobs waiting for one port is an EADDRINUSE a few seconds later).

The range is narrowed to three ports so that a repeat would show; the record sits in the test's own temp dir.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.lifecycle.startup import ports
from tests.conftest import ROOT, subprocess_env

NARROW = """
import sys
from entrypoint.lifecycle.startup import ports
ports.PORT_FLOOR = int(sys.argv[1])
ports._ephemeral_start = lambda: ports.PORT_FLOOR + 3
print(*ports.free_ports(int(sys.argv[2])))
"""


def three_free_ports() -> int:
    """The first of three consecutive ports under the ephemeral range that nothing here listens on."""
    for base in range(ports.PORT_FLOOR + 7000, ports.PORT_FLOOR + 9000, 3):
        if all(bindable(p) for p in range(base, base + 3)):
            return base
    pytest.skip("no three consecutive free ports")


def bindable(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> int:
    base = three_free_ports()
    monkeypatch.setattr(ports, "PORT_FLOOR", base)
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: base + 3)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(ports.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    return base


def test_a_port_handed_out_is_not_handed_out_again_while_it_is_recent(narrow: int) -> None:
    first = ports.free_ports(2)
    (second,) = ports.free_ports(1)
    assert sorted([*first, second]) == [narrow, narrow + 1, narrow + 2]  # each free port once, though all are free
    (third,) = ports.free_ports(1)
    assert third >= narrow + 3  # the three are recent: a port from the kernel instead, never a repeat


def test_a_pick_older_than_the_window_is_free_again(narrow: int) -> None:
    old = time.time() - ports.RECENT_SECONDS - 1
    ports.record_path().write_text("".join(f"{p} {old:.1f}\n" for p in range(narrow, narrow + 3)))
    assert sorted(ports.free_ports(3)) == [narrow, narrow + 1, narrow + 2]


def test_the_record_is_shared_by_every_process_of_the_host(narrow: int, tmp_path: Path) -> None:
    env = subprocess_env({"TMPDIR": str(tmp_path)})
    picked = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", NARROW, str(narrow), "1"], cwd=ROOT, env=env, text=True,
                             capture_output=True, timeout=60, check=True).stdout.split()
        picked += [int(p) for p in out]
    assert sorted(picked) == [narrow, narrow + 1, narrow + 2]
    assert ports.record_path().stat().st_mode & 0o777 == 0o600


def test_without_a_usable_record_ports_are_still_handed_out(narrow: int, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "record_path", lambda: tmp_path / "no such dir" / "record")
    assert len(set(ports.free_ports(3))) == 3


def test_a_torn_record_is_read_around(narrow: int) -> None:
    ports.record_path().write_text(f"{narrow} {time.time():.1f}\ngarbage\n{narrow + 1} not-a-time\n\n")
    assert narrow not in ports.free_ports(2)


def test_an_error_of_the_pick_itself_is_raised_as_it_is(narrow: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sockets(*args: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(ports.socket, "socket", no_sockets)
    with pytest.raises(OSError, match="Too many open files"):
        ports.free_ports(1)
