"""Images pinned by digest: ``--image NAME@sha256:...``, ``name:tag@sha256:...`` refused, ``--pin`` asking a registry
(a real HTTP registry protocol on 127.0.0.1: Bearer challenge, token, manifest HEAD) or a local build's record, and
every spec written with a pinned image parsed by the platforms' own types, TRAINER_IMAGE in each container of ours.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from entrypoint.jobs import pinning
from tests.jobspecs.helpers import (
    HVD_RS_IMAGE,
    TORCH_IMAGE,
    custom_job,
    custom_job_spec,
    gcloud_command_job_spec,
    job,
    kubeflow_model,
    one_line_error,
    run_python_script,
    shell_argv,
    trainjob_model,
)

pytestmark = pytest.mark.jobs

RUN = ["--", "--module", "trainers.x"]
INDEX = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": []}).encode()
INDEX_DIGEST = "sha256:" + hashlib.sha256(INDEX).hexdigest()
CONVERTED = "sha256:" + "0" * 64  # what a registry answers for a converted manifest when the index is not accepted
DIGEST = "sha256:" + "ab" * 32
PINNED = TORCH_IMAGE.replace(":v1", f"@{DIGEST}")


class Registry(BaseHTTPRequestHandler):
    """A registry as the Docker Registry HTTP API v2 describes it: a Bearer challenge, a token service, manifests by
    tag answered with Docker-Content-Digest for the media types the client accepts."""

    seen: ClassVar[list[dict[str, str]]] = []
    digest_header: ClassVar[bool] = True

    def log_message(self, *args: Any) -> None:
        pass

    def _token(self) -> None:
        Registry.seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        body = json.dumps({"token": "registry-token"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _manifest(self, send_body: bool) -> None:
        if self.path.startswith("/token"):
            return self._token()
        if self.headers.get("Authorization") != "Bearer registry-token":
            self.send_response(401)
            realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
            self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="fake-registry"')
            self.end_headers()
            return None
        if self.path != "/v2/team/trainer/manifests/v1":
            self.send_response(404)
            self.end_headers()
            return None
        index = "application/vnd.oci.image.index.v1+json" in self.headers.get("Accept", "")
        self.send_response(200)
        if Registry.digest_header:
            self.send_header("Docker-Content-Digest", INDEX_DIGEST if index else CONVERTED)
        self.send_header("Content-Length", str(len(INDEX)))
        self.end_headers()
        if send_body:
            self.wfile.write(INDEX)
        return None

    def do_HEAD(self) -> None:
        self._manifest(False)

    def do_GET(self) -> None:
        self._manifest(True)


@pytest.fixture
def registry() -> Iterator[str]:
    Registry.seen, Registry.digest_header = [], True
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_pin_asks_the_registry_for_the_index_digest(capsys: pytest.CaptureFixture[str], registry: str) -> None:
    code, out, err = job(capsys, "vertex", "--image", f"{registry}/team/trainer:v1", "--framework", "pytorch",
                         "--pin", *RUN)
    assert code == 0, err
    container = custom_job(out).job_spec.worker_pool_specs[0].container_spec
    assert container.image_uri == f"{registry}/team/trainer@{INDEX_DIGEST}"  # not the converted manifest's
    assert dict((e.name, e.value) for e in container.env) == {"TRAINER_IMAGE": container.image_uri}
    assert f"--pin: {registry}/team/trainer:v1 is {INDEX_DIGEST}" in err
    token = Registry.seen[0]
    assert "scope=repository%3Ateam%2Ftrainer%3Apull" in token["path"] and token["authorization"] == ""


def test_a_registry_that_sends_no_digest_header_is_hashed(capsys: pytest.CaptureFixture[str], registry: str) -> None:
    Registry.digest_header = False
    pinned, _ = pinning.pin(f"{registry}/team/trainer:v1")
    assert pinned.endswith(f"@{INDEX_DIGEST}")


def test_an_unknown_tag_is_one_line(capsys: pytest.CaptureFixture[str], registry: str) -> None:
    line = one_line_error(*job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", f"{registry}/team/trainer:v9",
                               "--framework", "pytorch", "--pin", *RUN)[::2])
    assert "--pin" in line and "does not exist" in line, line


def test_google_registries_get_the_callers_token_and_no_one_else_does(tmp_path: Path, registry: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gcloud = tmp_path / "bin" / "gcloud"
    gcloud.parent.mkdir()
    gcloud.write_text("#!/bin/sh\necho ya29.from-gcloud\n")
    gcloud.chmod(0o755)
    monkeypatch.setenv("PATH", f"{gcloud.parent}:/usr/bin:/bin")
    challenge = f'Bearer realm="http://{registry}/token",service="artifactregistry.googleapis.com"'
    assert pinning.bearer_token(challenge, pinning.where("us-docker.pkg.dev/p/r/pytorch:v1")) == "registry-token"
    basic = base64.b64encode(b"oauth2accesstoken:ya29.from-gcloud").decode()
    assert Registry.seen[-1]["authorization"] == f"Basic {basic}"
    pinning.bearer_token(challenge, pinning.where("ghcr.io/team/trainer:v1"))
    assert Registry.seen[-1]["authorization"] == ""  # a Google token goes to Google's registries only


def test_without_gcloud_the_metadata_servers_token_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Metadata(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            ok = self.path == pinning.TOKEN_PATH and self.headers.get("Metadata-Flavor") == "Google"
            body = json.dumps({"access_token": "ya29.from-metadata"}).encode() if ok else b""
            self.send_response(200 if ok else 403)
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud
        monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{server.server_address[1]}")
        assert pinning.google_access_token() == "ya29.from-metadata"
    finally:
        server.shutdown()
        server.server_close()


def test_a_local_build_is_pinned_from_its_record(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """images/local_build.py records the engine's digest beside the build (XDG_CACHE_HOME/trainer-images/built)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    line = one_line_error(*job(capsys, "vertex", "--image", "localhost/trainer-pytorch:cpu", "--pin", *RUN)[::2])
    assert "no digest recorded for a local build" in line, line
    record = tmp_path / "trainer-images" / "built" / "localhost_trainer-pytorch_cpu.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"id": "x", "inputs": "y", "digest": DIGEST}))
    code, out, err = job(capsys, "vertex", "--image", "localhost/trainer-pytorch:cpu", "--pin", *RUN)
    assert code == 0, err
    assert json.loads(out)["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["imageUri"] == \
        f"localhost/trainer-pytorch@{DIGEST}"


@pytest.mark.parametrize("target", [["vertex"], ["vertex-tuning", "--hypertune-metric", "a", "--goal", "maximize",
                                                 "--param-int", "n=1:4", "--max-trials", "2"],
                                    ["kubeflow", "--kind", "pytorchjob"]])
@pytest.mark.parametrize(("image", "says"), [(TORCH_IMAGE.replace(":v1", f":v1@{DIGEST}"), "names a tag and a digest"),
                                             (TORCH_IMAGE.replace(":v1", "@sha256:abc"), "64 lowercase hexadecimal")])
def test_a_tag_beside_a_digest_or_a_short_digest_is_refused(capsys: pytest.CaptureFixture[str], target: list[str],
                                                            image: str, says: str) -> None:
    line = one_line_error(*job(capsys, *target, "--image", image, *RUN)[::2])
    assert line.startswith("entrypoint: error: --image:") and says in line, line


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_every_vertex_format_of_a_pinned_job_parses_strictly(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    image = HVD_RS_IMAGE.replace(":v1-rs", f"-rs@{DIGEST}")  # reducers: Google's image gets none of our env
    argv = ["vertex", "--image", image, "--workers", "2", "--machine-type", "a2-highgpu-8g",
            "--reduction-servers", "2", *RUN]
    code, out, err = job(capsys, *argv)
    assert code == 0, err
    pools = json.loads(out)["jobSpec"]["workerPoolSpecs"]
    custom_job(out)
    assert [_env(p["containerSpec"]).get("TRAINER_IMAGE") for p in pools] == [image, image, None]
    code, config, err = job(capsys, *argv[:-3], "--format", "gcloud-config", *RUN)
    assert code == 0, err
    custom_job_spec(yaml.safe_load(config))
    code, script, err = job(capsys, *argv[:-3], "--format", "python", *RUN)
    assert code == 0, err
    (made,) = run_python_script(script, monkeypatch, "create_custom_job", "custom_job")
    assert made.job_spec.worker_pool_specs[0].container_spec.image_uri == image


def test_a_pinned_gcloud_command_names_the_digest_and_says_what_it_cannot_pass(capsys: pytest.CaptureFixture[str],
                                                                               tmp_path: Path) -> None:
    code, out, err = job(capsys, "vertex", "--image", PINNED, "--workers", "2", "--format", "gcloud-command", *RUN)
    assert code == 0 and "cannot pass TRAINER_IMAGE" in err, err
    _, spec = gcloud_command_job_spec(shell_argv(out, tmp_path)[1:])
    custom_job_spec(spec)
    assert {p["containerSpec"]["imageUri"] for p in spec["workerPoolSpecs"]} == {PINNED}


def test_a_pinned_tuning_job_parses_strictly(capsys: pytest.CaptureFixture[str]) -> None:
    from google.cloud.aiplatform_v1.types import HyperparameterTuningJob

    code, out, err = job(capsys, "vertex-tuning", "--image", PINNED, "--hypertune-metric", "a", "--goal", "maximize",
                         "--param-int", "n=1:4", "--max-trials", "2", *RUN)
    assert code == 0, err
    pool = HyperparameterTuningJob.from_json(out).trial_job_spec.worker_pool_specs[0]
    assert pool.container_spec.image_uri == PINNED and pool.container_spec.env[0].value == PINNED


@pytest.mark.parametrize("kind", ["pytorchjob", "tfjob", "trainjob"])
def test_every_kubeflow_kind_of_a_pinned_job_parses_strictly(capsys: pytest.CaptureFixture[str], kind: str) -> None:
    image = PINNED.replace("pytorch@", "tensorflow@") if kind == "tfjob" else PINNED
    code, out, err = job(capsys, "kubeflow", "--kind", kind, "--image", image, "--workers", "2", *RUN)
    assert code == 0, err
    manifest = yaml.safe_load(out)
    if kind == "trainjob":
        trainjob_model(manifest)
        assert _env(manifest["spec"]["trainer"]) == {"TRAINER_IMAGE": image}
        return
    kubeflow_model(manifest)
    specs = manifest["spec"].get("pytorchReplicaSpecs") or manifest["spec"]["tfReplicaSpecs"]
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["image"] == image and _env(container)["TRAINER_IMAGE"] == image
    line = one_line_error(*job(capsys, "kubeflow", "--kind", kind, "--image", image, "--env", f"TRAINER_IMAGE={image}",
                               *RUN)[::2])
    assert "TRAINER_IMAGE is written by the job" in line, line
