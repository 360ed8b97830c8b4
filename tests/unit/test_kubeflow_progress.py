"""Kubeflow Trainer's progress posts (``outputs/goodput/kubeflow_progress.py``) against a real HTTPS server on 127.0.0.1
whose certificate a test CA signed: the path, the bearer token (read again for each post) and the body Kubeflow's status
server takes; TLS verified by the given CA only (another certificate fails, said once); a hanging server never holds
up ``update`` and only the newest update is sent after it; nothing without the platform's variables."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from entrypoint.cluster.environments.settings import read_settings
from entrypoint.outputs.goodput.kubeflow_progress import MAX_METRICS, KubeflowProgress, _Update

GENEROUS = 60.0  # seconds to wait for an event on a loaded machine (each comes in well under a second)
PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/mnist/status"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.secret-part.signature"


# --- certificates --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tls:
    ca: Path  # the CA's certificate (what the client is given)
    cert: Path  # the server's certificate, signed by that CA
    key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_tls(where: Path, label: str) -> Tls:
    """A CA and a server certificate for 127.0.0.1 it signed, as files under ``where``."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(f"{label} CA")).issuer_name(_name(f"{label} CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    tls = Tls(where / f"{label}-ca.crt", where / f"{label}.crt", where / f"{label}.key")
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return tls


# --- the status server ---------------------------------------------------------------------------------------------

@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class StatusServer:
    """What Kubeflow's status server does for these tests: each POST recorded, answered 200 with its body
    (``hold``: not answered until ``release`` is set; ``refuse``: answered 403 with a Kubernetes Status saying it)."""

    url: str
    hold: bool = False
    refuse: str | None = None
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[Received] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, count: int) -> list[Received]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.requests) >= count, GENEROUS), self.requests
            return list(self.requests)


@contextmanager
def status_server(tls: Tls, hold: bool = False, refuse: str | None = None) -> Iterator[StatusServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert, tls.key)
    state = StatusServer("", hold=hold, refuse=refuse)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.arrived:
                state.requests.append(Received(self.command, self.path, dict(self.headers), json.loads(raw)))
                state.arrived.notify_all()
            if state.hold:
                state.release.wait(GENEROUS)
            if state.refuse is not None:
                raw = json.dumps({"kind": "Status", "status": "Failure", "message": state.refuse,
                                  "reason": "Forbidden", "code": 403}).encode()
            self.send_response(403 if state.refuse is not None else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def get_request(self) -> tuple[Any, Any]:  # the handshake in the handler's thread, not in the accept loop
            sock, address = self.socket.accept()
            return context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

        def handle_error(self, request: Any, client_address: Any) -> None:  # a refused handshake: expected here
            pass

    server = Server(("127.0.0.1", 0), Handler)
    state.url = f"https://127.0.0.1:{server.server_address[1]}{PATH}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)  # quick shutdown
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    return make_tls(tmp_path, "trainer")


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def until(condition: Any) -> None:
    """Wait for an event the code under test makes happen (a post done, a post failed)."""
    deadline = time.monotonic() + GENEROUS
    while not condition():
        assert time.monotonic() < deadline, "the event never came"
        time.sleep(0.01)


def metrics_of(received: Received) -> dict[str, str]:
    return {m["name"]: m["value"] for m in received.body["trainerStatus"]["metrics"]}


# --- the tests -----------------------------------------------------------------------------------------------------

def test_an_update_is_posted_to_the_path_with_the_bearer_token_and_kubeflows_body(tls: Tls, token_file: Path) -> None:
    with status_server(tls) as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), min_interval=0)
        progress.update(50, 200, {"loss": 0.25})
        assert progress.close(GENEROUS)
        [got] = server.wait_for(1)
    assert (got.method, got.path) == ("POST", PATH)
    assert got.headers["Authorization"] == f"Bearer {TOKEN}"
    assert got.headers["Content-Type"] == "application/json"
    assert set(got.body) == {"trainerStatus"}
    status = got.body["trainerStatus"]
    assert status["progressPercentage"] == 25
    assert "estimatedRemainingSeconds" not in status  # no rate from a single update
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status["lastUpdatedTime"])
    assert status["metrics"] == [{"name": "step", "value": "50"}, {"name": "total_steps", "value": "200"},
                                 {"name": "loss", "value": "0.25"}]
    assert (progress.posted, progress.failed) == (1, 0)


def test_the_token_is_read_again_for_each_post(tls: Tls, token_file: Path) -> None:
    with status_server(tls) as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), min_interval=0)
        progress.update(1, 10, {})
        server.wait_for(1)
        until(lambda: progress.posted == 1)
        token_file.write_text("rotated-token")  # the kubelet rotates the projected token
        progress.update(2, 10, {})
        assert progress.close(GENEROUS)
        first, second = server.wait_for(2)
    assert first.headers["Authorization"] == f"Bearer {TOKEN}"
    assert second.headers["Authorization"] == "Bearer rotated-token"


def test_a_server_whose_certificate_the_ca_did_not_sign_fails_said_once_and_training_goes_on(
        tmp_path: Path, tls: Tls, token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = make_tls(tmp_path, "other")  # a valid certificate for 127.0.0.1, from another CA
    caplog.set_level(logging.INFO, logger="entrypoint")
    with status_server(other) as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), min_interval=0)
        for step in (1, 2, 3):
            progress.update(step, 10, {"loss": 1.0})
            until(lambda: progress.failed == step)  # noqa: B023 (used at once)
        assert progress.close(GENEROUS)
        assert server.requests == []  # nothing reached the server: the handshake failed
    assert progress.posted == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "Kubeflow Trainer progress" in warnings[0].getMessage() and "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert TOKEN not in caplog.text and "secret-part" not in caplog.text


def test_a_refused_update_is_said_with_the_servers_message_and_never_the_token(
        tls: Tls, token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="entrypoint")
    with status_server(tls, refuse=f"Forbidden: token {TOKEN} is not for this TrainJob") as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), min_interval=0)
        progress.update(1, 10, {})
        assert progress.close(GENEROUS)
        server.wait_for(1)
    assert (progress.posted, progress.failed) == (0, 1)
    assert "HTTP 403: Forbidden: token *** is not for this TrainJob" in caplog.text
    assert "secret-part" not in caplog.text


def test_the_same_server_is_trusted_with_its_own_ca(tmp_path: Path, tls: Tls, token_file: Path) -> None:
    other = make_tls(tmp_path, "other")
    with status_server(other) as server:
        progress = KubeflowProgress(server.url, str(other.ca), str(token_file), min_interval=0)
        progress.update(1, 10, {})
        assert progress.close(GENEROUS)
        server.wait_for(1)
    assert (progress.posted, progress.failed) == (1, 0)


def test_a_hanging_server_never_holds_up_update_and_only_the_newest_update_follows(tls: Tls, token_file: Path) -> None:
    with status_server(tls, hold=True) as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), timeout=GENEROUS, min_interval=0)
        progress.update(1, 100, {"loss": 1.0})
        server.wait_for(1)  # the first post is now held by the server
        caller = threading.Thread(target=lambda: [progress.update(s, 100, {"loss": 1.0 / s}) for s in range(2, 51)])
        caller.start()
        caller.join(GENEROUS)
        assert not caller.is_alive(), "update() waited for the hanging post"
        assert len(server.requests) == 1
        server.release.set()
        assert progress.close(GENEROUS)
        requests = server.wait_for(2)
    assert len(requests) == 2  # 49 updates while the post hung: one post, of the newest
    assert metrics_of(requests[1])["step"] == "50"
    assert requests[1].body["trainerStatus"]["progressPercentage"] == 50


def test_close_waits_only_as_long_as_it_is_told(tls: Tls, token_file: Path) -> None:
    with status_server(tls, hold=True) as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), timeout=GENEROUS, min_interval=0)
        progress.update(1, 100, {})
        server.wait_for(1)
        assert progress.close(0.05) is False  # the post is still held: close gives up at its timeout
        progress.update(2, 100, {})  # after close: not taken
        server.release.set()
        until(lambda: progress.posted == 1)
        assert progress.close(GENEROUS)
    assert len(server.requests) == 1


def test_updates_coming_faster_than_the_interval_are_coalesced(tls: Tls, token_file: Path) -> None:
    with status_server(tls) as server:
        progress = KubeflowProgress(server.url, str(tls.ca), str(token_file), min_interval=GENEROUS)
        progress.update(1, 10, {})
        server.wait_for(1)
        for step in range(2, 10):
            progress.update(step, 10, {})  # within the interval: held back, each replacing the last
        progress.update(10, 10, {}, done=True)  # the end is posted without waiting for the interval
        requests = server.wait_for(2)
        assert progress.close(GENEROUS)
    assert len(requests) == 2 and metrics_of(requests[1])["step"] == "10"
    assert requests[1].body["trainerStatus"]["progressPercentage"] == 100
    assert requests[1].body["trainerStatus"]["estimatedRemainingSeconds"] == 0


def test_the_status_keeps_the_servers_limits_and_the_eta_follows_the_rate(token_file: Path) -> None:
    progress = KubeflowProgress("https://127.0.0.1:1/status", None, str(token_file))
    try:
        first = progress._status(_Update(100, 1000, {}, False, 0.0, clock=1000.0))
        assert first["progressPercentage"] == 10 and "estimatedRemainingSeconds" not in first
        later = progress._status(_Update(200, 1000, {}, False, 0.0, clock=1010.0))
        assert later["progressPercentage"] == 20 and later["estimatedRemainingSeconds"] == 80  # 800 steps, 10/s
        back = progress._status(_Update(150, 1000, {}, False, 0.0, clock=1020.0))  # a recovery went back: new rate
        assert back["progressPercentage"] == 15 and "estimatedRemainingSeconds" not in back
        unknown = progress._status(_Update(7, None, {"step": 99.0, "x" * 65: 1.0}, False, 0.0, clock=1030.0))
        assert "progressPercentage" not in unknown
        assert unknown["metrics"] == [{"name": "step", "value": "99.0"}]  # the caller's own wins; a too-long name goes
        many = progress._status(_Update(1, 2, {f"m{i}": float(i) for i in range(300)}, False, 0.0, clock=1040.0))
        assert len(many["metrics"]) == MAX_METRICS
        assert progress._status(_Update(5, 10, {}, True, 0.0, clock=1050.0))["progressPercentage"] == 100
    finally:
        progress.close(0)


def test_from_settings_needs_the_platforms_variables(tmp_path: Path, token_file: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    url, ca = "https://trainer.kubeflow.svc:8082" + PATH, str(tmp_path / "ca.crt")
    assert KubeflowProgress.from_settings(read_settings({})) is None
    assert KubeflowProgress.from_settings(read_settings({"KUBEFLOW_TRAINER_SERVER_URL": " "})) is None
    settings = read_settings({"KUBEFLOW_TRAINER_SERVER_URL": url, "KUBEFLOW_TRAINER_SERVER_CA_CERT": ca,
                              "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token_file)})
    progress = KubeflowProgress.from_settings(settings)
    assert progress is not None
    assert (progress.url, progress.ca_file, progress.token_file) == (url, ca, str(token_file))
    progress.close(0)
    caplog.set_level(logging.WARNING, logger="entrypoint")
    assert KubeflowProgress.from_settings(read_settings({"KUBEFLOW_TRAINER_SERVER_URL": url})) is None
    assert "KUBEFLOW_TRAINER_SERVER_TOKEN is not" in caplog.text
    assert KubeflowProgress.from_settings(read_settings({"KUBEFLOW_TRAINER_SERVER_URL": "trainer:8082",
                                                         "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token_file)})) is None
    assert "is not an http(s) URL" in caplog.text
