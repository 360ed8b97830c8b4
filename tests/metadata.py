"""A fake GCE metadata server on 127.0.0.1 for the advance-notice tests (``GCE_METADATA_HOST`` points at it).

It serves ``instance/preempted`` and ``instance/maintenance-event`` from ``values`` (a test changes them), refuses a
request without ``Metadata-Flavor: Google`` with 403 as GCE does, answers with that header (unless
``flavor=False``: an impostor the watcher must ignore), and honours ``?wait_for_change=true`` with ``last_etag`` and
``timeout_sec`` (a hanging GET: it returns when the value's ETag differs from ``last_etag``, or at the timeout).
"""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/"


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class FakeMetadata:
    """The server: ``host`` is what ``GCE_METADATA_HOST`` takes; ``values`` what it serves; ``refused`` counts 403s."""

    def __init__(self, flavor: bool = True) -> None:
        self.values = {"instance/preempted": "FALSE", "instance/maintenance-event": "NONE"}
        self.flavor, self.refused, self.requests = flavor, 0, 0
        self.hanging: dict[str, int] = {}  # the hanging GETs waiting now, by path (a test waits for them)
        self.closed = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests += 1
                if self.headers.get("Metadata-Flavor") != "Google":
                    fake.refused += 1
                    self._answer(403, "missing Metadata-Flavor:Google header")
                    return
                url = urlsplit(self.path)
                path = url.path.removeprefix(PREFIX)
                if not url.path.startswith(PREFIX) or path not in fake.values:
                    self._answer(404, "not found")
                    return
                query = parse_qs(url.query)
                if query.get("wait_for_change") == ["true"]:
                    fake.wait(path, query.get("last_etag", [""])[0], float(query.get("timeout_sec", ["60"])[0]))
                self._answer(200, fake.values[path])

            def _answer(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                if fake.flavor:
                    self.send_header("Metadata-Flavor", "Google")
                self.send_header("ETag", etag(body))
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *_args: None  # type: ignore[method-assign]  # a client gone mid-wait
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait(self, path: str, last: str, timeout: float) -> None:
        """A hanging GET: until ``path``'s value is not the one ``last`` names (without ``last``: until it changes)."""
        last = last or etag(self.values[path])
        deadline = time.monotonic() + min(timeout, 60.0)
        self.hanging[path] = self.hanging.get(path, 0) + 1
        try:
            while time.monotonic() < deadline and etag(self.values[path]) == last and not self.closed.wait(0.05):
                pass
        finally:
            self.hanging[path] -= 1

    def waiting(self, timeout: float = 60.0) -> bool:
        """Until a hanging GET waits on every path (the watcher is listening for a change of each), at most
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not all(self.hanging.get(path, 0) for path in self.values):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def __enter__(self) -> FakeMetadata:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()
