"""``job kubeflow --volume``: a PersistentVolumeClaim, a hostPath or a Cloud Storage bucket in every pod.

Kubernetes' volumes (https://kubernetes.io/docs/concepts/storage/volumes/): ``persistentVolumeClaim``
(``claimName``, ``readOnly``), ``hostPath`` (``path``, ``type``), ``csi``; a Volume's name "must be a DNS_LABEL and
unique within the pod", a mount path must not contain ':'. Cloud Storage through GKE's Cloud Storage FUSE CSI driver
(https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-ephemeral): driver
``gcsfuse.csi.storage.gke.io``, ``volumeAttributes.bucketName`` and ``mountOptions`` ("all the flags in one string
separated by a comma , without spaces"), and the pod annotation ``gke-gcsfuse/volumes: "true"`` "under
spec.template.metadata" for workloads such as jobs; the pods' service account reads the bucket (Workload Identity).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError

KINDS = ("pvc", "hostpath", "gcs")
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATION = ("gke-gcsfuse/volumes", "true")
HOST_PATH_TYPES = ("DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_BUCKET = re.compile(r"[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]")
_USAGE = ("expected pvc:CLAIM:/PATH, hostpath:/HOST/PATH:/PATH or gcs:BUCKET:/PATH, then :ro, :type=T (hostpath) or "
          ":mount-options=A,B (gcs, last)")


@dataclass(frozen=True)
class Volume:
    """One volume and its mount in the training container."""

    name: str
    kind: str  # pvc, hostpath, gcs
    source: str  # the claim, the host path, the bucket
    mount_path: str
    read_only: bool = False
    host_path_type: str | None = None
    mount_options: str | None = None

    def to_volume(self) -> dict[str, Any]:
        """The pod's Volume."""
        if self.kind == "pvc":
            claim: dict[str, Any] = {"claimName": self.source}
            if self.read_only:
                claim["readOnly"] = True
            return {"name": self.name, "persistentVolumeClaim": claim}
        if self.kind == "hostpath":
            host = {"path": self.source, **({"type": self.host_path_type} if self.host_path_type else {})}
            return {"name": self.name, "hostPath": host}
        attributes = {"bucketName": self.source, **({"mountOptions": self.mount_options} if self.mount_options
                                                    else {})}
        return {"name": self.name, "csi": {"driver": GCSFUSE_DRIVER, "readOnly": self.read_only,
                                           "volumeAttributes": attributes}}

    def to_mount(self) -> dict[str, Any]:
        """The container's VolumeMount."""
        return {"name": self.name, "mountPath": self.mount_path, **({"readOnly": True} if self.read_only else {})}


def _options(kind: str, words: list[str]) -> tuple[bool, str | None]:
    read_only, host_type = False, None
    for word in words:
        key, _, value = word.partition("=")
        if word == "ro":
            read_only = True
        elif kind == "hostpath" and key == "type" and value in HOST_PATH_TYPES:
            host_type = value
        else:
            raise ConfigError("--volume", f"{kind}: {key!r} is not an option here; {_USAGE}")
    return read_only, host_type


def _mount_options(kind: str, options: str) -> tuple[str, str | None]:
    """``...:mount-options=A,B`` comes last and takes the rest, ':' included (gcsfuse's config-file flags are
    written ``file-cache:max-size-mb:-1``); the options before it, and the mount options."""
    head, sep, value = f":{options}".partition(":mount-options=")
    if not sep:
        return options, None
    if kind != "gcs" or not value or " " in value or value.startswith(",") or value.endswith(","):
        raise ConfigError("--volume", f"{kind}: mount-options is a gcs option, A,B,... without spaces, and comes "
                          f"last; {_USAGE}")
    return head[1:], value


def parse(texts: list[str]) -> tuple[Volume, ...]:
    """``--volume`` values, checked; names ``<kind>-<n>`` (DNS labels, unique in the pod)."""
    out: list[Volume] = []
    for text in texts:
        kind, _, rest = text.partition(":")
        source, _, rest = rest.partition(":")
        path, _, options = rest.partition(":")
        if kind not in KINDS or not source or not path.startswith("/"):
            raise ConfigError("--volume", _USAGE)
        if kind == "pvc" and not (_DNS_1123.fullmatch(source) and len(source) <= 253):
            raise ConfigError("--volume", "pvc: a claim's name is a DNS-1123 subdomain")
        if kind == "hostpath" and not source.startswith("/"):
            raise ConfigError("--volume", "hostpath: the node's path is absolute")
        if kind == "gcs" and not _BUCKET.fullmatch(source):
            raise ConfigError("--volume", "gcs: expected a bucket's name (no gs://)")
        options, mount_options = _mount_options(kind, options)
        read_only, host_type = _options(kind, [w for w in options.split(":") if w])
        out.append(Volume(f"{kind}-{len(out)}", kind, source, path, read_only, host_type, mount_options))
    paths = [v.mount_path for v in out] + ["/dev/shm"]
    if len(set(paths)) != len(paths):
        raise ConfigError("--volume", "two volumes mounted at the same path (or at /dev/shm, which --shm-size owns)")
    return tuple(out)


def pod_annotations(volumes: tuple[Volume, ...]) -> dict[str, str]:
    """The pod annotations the volumes need: GKE's Cloud Storage FUSE webhook looks for gke-gcsfuse/volumes."""
    return dict([GCSFUSE_ANNOTATION]) if any(v.kind == "gcs" for v in volumes) else {}
