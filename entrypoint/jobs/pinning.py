"""Images named by digest: ``--image NAME@sha256:...`` checked; ``--pin`` resolving a tag to the digest it names now.

- A tag can be moved; a digest names the bytes (the runtime verifies what it pulls against it). Vertex AI refuses a
  reference with both, ``name:tag@sha256:...`` ("400 Invalid image URI": googleapis/python-aiplatform#1861), so a
  pinned reference is ``NAME@sha256:<64 hex>`` alone, for every job this writes.
- ``--pin`` asks the registry (the Docker Registry HTTP API v2, https://distribution.github.io/distribution/spec/api/):
  ``HEAD /v2/<repository>/manifests/<tag>`` with ``Accept`` naming the OCI index, the Docker manifest list and both
  single manifests (without them a registry may answer for a converted manifest whose digest is not the one a pull of
  a multi-platform tag verifies), and reads ``Docker-Content-Digest``. A ``401`` with a Bearer challenge is answered
  as registries expect: a token from the challenge's realm for ``repository:<name>:pull``, anonymously, or for Google's
  registries (``*.pkg.dev``, ``gcr.io``) with the caller's access token as the password of ``oauth2accesstoken`` (from
  ``gcloud auth print-access-token``, else the metadata server's default service account). A Google token is never
  sent to another host.
- A local build (``localhost/trainer-<image>:cpu``, images/local_build.py) is pinned from the record the build keeps:
  ``~/.cache/trainer-images/built/<reference>.json``, whose ``digest`` is the engine's name for the image.
- Hosts ``localhost:PORT`` and ``127.0.0.1:PORT`` are plain-HTTP registries (a registry on this machine), like Docker's
  default for them; every other host is HTTPS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrypoint.cluster.environments.settings import image_cache_dir, metadata_host
from entrypoint.errors import ConfigError
from entrypoint.jobs.images import parse_image

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
MANIFEST_TYPES = ("application/vnd.oci.image.index.v1+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json",
                  "application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
DOCKER_HUB = "registry-1.docker.io"
GOOGLE_REGISTRIES = (".pkg.dev", "gcr.io")
TIMEOUT = 30  # seconds per registry request
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


def check_reference(uri: str, flag: str = "--image") -> None:
    """A reference with a digest must be ``NAME@sha256:<64 lowercase hex>``; one line naming what is wrong."""
    if "@" not in uri.rsplit("/", 1)[-1]:
        return
    ref = parse_image(uri)
    if ref.tag:
        raise ConfigError(flag, f"names a tag and a digest (:{ref.tag}@...): Vertex AI refuses that form "
                          "(googleapis/python-aiplatform#1861) and the digest alone decides what runs: write "
                          "NAME@sha256:... without the tag")
    if not DIGEST.fullmatch(ref.digest):
        raise ConfigError(flag, "a digest is sha256: and 64 lowercase hexadecimal digits (NAME@sha256:...)")


@dataclass(frozen=True)
class Where:
    """A reference read as a registry reads it: host, repository, tag."""

    host: str
    repository: str
    tag: str

    @property
    def scheme(self) -> str:
        return "http" if self.host.split(":")[0] in ("localhost", "127.0.0.1") else "https"

    @property
    def name(self) -> str:
        """The reference without its tag (``NAME`` of ``NAME@sha256:...``)."""
        return f"{self.host}/{self.repository}" if self.host != DOCKER_HUB else self.repository.removeprefix("library/")

    def google(self) -> bool:
        return self.host == "gcr.io" or self.host.endswith(GOOGLE_REGISTRIES)


def where(uri: str) -> Where:
    """Docker's reading of a reference: the first component is a host when it has a '.' or ':' or is localhost;
    otherwise the image is Docker Hub's (``library/`` for one-component names); no tag means ``latest``."""
    path, _, _ = uri.partition("@")
    head, slash, rest = path.partition("/")
    if slash and ("." in head or ":" in head or head == "localhost"):
        host, path = head, rest
    else:
        host, path = DOCKER_HUB, path if "/" in path else f"library/{path}"
    name, colon, tag = path.rpartition(":") if ":" in path.rsplit("/", 1)[-1] else (path, "", "")
    return Where(host, name, tag if colon else "latest")


def pin(uri: str) -> tuple[str, str]:
    """``uri`` named by the digest its tag names now, and a line saying where the digest came from."""
    check_reference(uri)
    if parse_image(uri).digest:
        return uri, f"--pin: {uri} is pinned already"
    at = where(uri)
    if at.host == "localhost":
        digest = local_digest(uri)
        return f"{at.name}@{digest}", f"--pin: {uri} is {digest} (this machine's build record, images/local_build.py)"
    digest = registry_digest(at)
    return f"{at.name}@{digest}", f"--pin: {uri} is {digest} now (asked {at.host}); the job runs that image"


def local_digest(uri: str) -> str:
    """The digest images/local_build.py recorded for its build of ``uri``."""
    record = Path(image_cache_dir()) / "built" / (re.sub(r"[^A-Za-z0-9_.-]", "_", uri) + ".json")
    try:
        digest = str(json.loads(record.read_text()).get("digest", ""))
    except (OSError, ValueError, AttributeError):
        digest = ""
    if not DIGEST.fullmatch(digest):
        raise ConfigError("--pin", f"no digest recorded for a local build of {uri} ({record}): build it with "
                          "`python3 images/local_build.py build` (podman records one; docker gives a local image none "
                          "until it is pushed)")
    return digest


def registry_digest(at: Where) -> str:
    """The digest ``at.tag`` names in its registry (a HEAD, then a GET when the HEAD says no digest)."""
    url = f"{at.scheme}://{at.host}/v2/{at.repository}/manifests/{at.tag}"
    token = None
    for _ in range(2):
        try:
            with _open(url, "HEAD", token) as answer:
                digest = answer.headers.get("Docker-Content-Digest", "")
            if not DIGEST.fullmatch(digest):
                with _open(url, "GET", token) as answer:
                    digest = "sha256:" + hashlib.sha256(answer.read()).hexdigest()
            return digest
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
            if exc.code == 401 and token is None and challenge.lower().startswith("bearer"):
                token = bearer_token(challenge, at)
                continue
            raise ConfigError("--pin", _refusal(at, exc.code)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConfigError("--pin", f"{at.host} cannot be reached ({getattr(exc, 'reason', exc)}): pin the image "
                              "yourself (NAME@sha256:...)") from None
    raise ConfigError("--pin", _refusal(at, 401))


def _refusal(at: Where, code: int) -> str:
    if code == 404:
        return f"{at.host}/{at.repository}:{at.tag} does not exist in its registry (404)"
    if code in (401, 403):
        how = ("the caller's Google credentials (gcloud auth login, or the metadata server's service account) may not "
               "read it" if at.google() else "this registry needs credentials this command does not use")
        return f"{at.host} refused to say what {at.repository}:{at.tag} is ({code}): {how}; pin it yourself " \
               "(NAME@sha256:...)"
    return f"{at.host} answered {code} for {at.repository}:{at.tag}"


def _open(url: str, method: str, token: str | None) -> Any:
    headers = {"Accept": ", ".join(MANIFEST_TYPES), "User-Agent": "trainer-entrypoint-job"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=TIMEOUT)


def bearer_token(challenge: str, at: Where) -> str:
    """A registry token for pulling ``at.repository``: from the challenge's realm, anonymously, or for Google's
    registries with the caller's access token (never sent elsewhere)."""
    fields = dict(_CHALLENGE.findall(challenge))
    realm = fields.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise ConfigError("--pin", f"{at.host} asked for a token without saying where to get one")
    query = urllib.parse.urlencode({k: v for k, v in (("service", fields.get("service", "")),
                                                      ("scope", f"repository:{at.repository}:pull")) if v})
    headers = {"User-Agent": "trainer-entrypoint-job"}
    if at.google():
        secret = base64.b64encode(f"oauth2accesstoken:{google_access_token()}".encode()).decode()
        headers["Authorization"] = f"Basic {secret}"
    request = urllib.request.Request(f"{realm}{'&' if '?' in realm else '?'}{query}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            data = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise ConfigError("--pin", _refusal(at, exc.code)) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConfigError("--pin", f"{at.host}'s token service did not answer ({exc})") from None
    token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
    if not isinstance(token, str) or not token:
        raise ConfigError("--pin", f"{at.host}'s token service gave no token")
    return token


def google_access_token() -> str:
    """The caller's Google access token: ``gcloud auth print-access-token``, else the metadata server's default
    service account's (on a Google Cloud VM); its value is never printed."""
    gcloud = shutil.which("gcloud")
    if gcloud:
        done = subprocess.run([gcloud, "auth", "print-access-token"], capture_output=True, text=True, timeout=60,
                              check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    request = urllib.request.Request(f"http://{metadata_host()}{TOKEN_PATH}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=3) as answer:
            token = json.loads(answer.read()).get("access_token", "")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        token = ""
    if not token:
        raise ConfigError("--pin", "no Google credentials: `gcloud auth login` (or run on a VM with a service "
                          "account), or pin the image yourself (NAME@sha256:...)")
    return str(token)
