"""``job kubeflow --volume``: a PersistentVolumeClaim, a hostPath, a Cloud Storage bucket or scratch space in every pod.

Kubernetes' volumes (https://kubernetes.io/docs/concepts/storage/volumes/): ``persistentVolumeClaim``
(``claimName``, ``readOnly``), ``hostPath`` (``path``, ``type``), ``csi``; a Volume's name "must be a DNS_LABEL and
unique within the pod", a mount path must not contain ':'. Cloud Storage through GKE's Cloud Storage FUSE CSI driver
(https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-ephemeral): driver
``gcsfuse.csi.storage.gke.io``, ``volumeAttributes.bucketName`` and ``mountOptions`` ("all the flags in one string
separated by a comma , without spaces"), and the pod annotation ``gke-gcsfuse/volumes: "true"`` "under
spec.template.metadata" for workloads such as jobs; the pods' service account reads the bucket (Workload Identity).
Its file cache (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-perf): "set the
volume attribute fileCacheCapacity or use the file-cache:max-size-mb mount option"; by default an emptyDir "backed by
the ephemeral storage configured on the node", or the pod's own volume named ``gke-gcsfuse-cache`` (memory, or an
emptyDir on Local SSD nodes). Scratch space: ``emptyDir`` in memory (``medium: Memory``) or on the node's ephemeral
storage, its boot disk or, on nodes labelled ``cloud.google.com/gke-ephemeral-storage-local-ssd``, Local SSD.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from entrypoint.errors import ConfigError

KINDS = ("pvc", "hostpath", "gcs", "emptydir")
MEDIA = ("memory", "disk", "local-ssd")  # an emptyDir's (and the Cloud Storage FUSE file cache's) backing
# GKE labels the nodes whose ephemeral storage (emptyDir) is on Local SSD (node pools made with
# --ephemeral-storage-local-ssd): https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/local-ssd
LOCAL_SSD_NODES = ("cloud.google.com/gke-ephemeral-storage-local-ssd", "true")
GCSFUSE_CACHE = "gke-gcsfuse-cache"  # the driver's sidecar takes a pod volume of this name as its file cache
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATION = ("gke-gcsfuse/volumes", "true")
# The driver's sidecar resources (pod annotations) and its webhook's defaults, GoogleCloudPlatform/gcs-fuse-csi-driver
# cmd/webhook/main.go (sidecar-ephemeral-storage-limit 5Gi, sidecar-memory-limit 256Mi):
SIDECAR_DISK = ("gke-gcsfuse/ephemeral-storage-limit", "gke-gcsfuse/ephemeral-storage-request", 5 * 2**30)
SIDECAR_MEMORY = ("gke-gcsfuse/memory-limit", "gke-gcsfuse/memory-request", 256 * 2**20)
HOST_PATH_TYPES = ("DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_BUCKET = re.compile(r"[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]")
_USAGE = ("expected pvc:CLAIM:/PATH, hostpath:/HOST/PATH:/PATH, gcs:BUCKET:/PATH or emptydir:memory|disk|local-ssd:"
          "/PATH, then :ro, :type=T (hostpath), :size=Q (emptydir), :file-cache=Q|-1, :cache=memory|local-ssd or "
          ":mount-options=A,B (gcs, last)")
_SIZE = re.compile(r"(\d+(\.\d+)?|\.\d+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


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
    size: str | None = None  # emptydir: sizeLimit; gcs: the file cache's capacity (fileCacheCapacity)
    cache: str | None = None  # gcs: the file cache's own volume, memory or local-ssd (default: the node's disk)

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
        if self.kind == "emptydir":
            return {"name": self.name, "emptyDir": empty_dir(self.source, self.size)}
        attributes = {"bucketName": self.source, **({"mountOptions": self.mount_options} if self.mount_options
                                                    else {}), **({"fileCacheCapacity": self.size} if self.size
                                                                 else {})}
        return {"name": self.name, "csi": {"driver": GCSFUSE_DRIVER, "readOnly": self.read_only,
                                           "volumeAttributes": attributes}}

    def to_mount(self) -> dict[str, Any]:
        """The container's VolumeMount."""
        return {"name": self.name, "mountPath": self.mount_path, **({"readOnly": True} if self.read_only else {})}


def empty_dir(medium: str, size: str | None) -> dict[str, Any]:
    """An emptyDir on ``medium``: memory (tmpfs, counted as the container's memory), or the node's ephemeral
    storage, its disk or Local SSD (the pod then selects Local SSD nodes: ``node_labels``)."""
    out: dict[str, Any] = {"medium": "Memory"} if medium == "memory" else {}
    if size:
        out["sizeLimit"] = size
    return out


def _options(kind: str, words: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {"read_only": False}
    for word in words:
        key, _, value = word.partition("=")
        if word == "ro" and kind != "emptydir":
            found["read_only"] = True
        elif kind == "hostpath" and key == "type" and value in HOST_PATH_TYPES:
            found["host_path_type"] = value
        elif (kind, key) in (("emptydir", "size"), ("gcs", "file-cache")) and (
                _SIZE.fullmatch(value) or (kind == "gcs" and value == "-1")):
            found["size"] = value
        elif kind == "gcs" and key == "cache" and value in ("memory", "local-ssd"):
            found["cache"] = value
        else:
            raise ConfigError("--volume", f"{kind}: {key!r} is not an option here (or not its value); {_USAGE}")
    return found


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
        if kind == "emptydir" and source not in MEDIA:
            raise ConfigError("--volume", f"emptydir: the medium is one of {', '.join(MEDIA)}")
        options, mount_options = _mount_options(kind, options)
        found = _options(kind, [w for w in options.split(":") if w])
        out.append(Volume(f"{kind}-{len(out)}", kind, source, path, mount_options=mount_options, **found))
    paths = [v.mount_path for v in out] + ["/dev/shm"]
    if len(set(paths)) != len(paths):
        raise ConfigError("--volume", "two volumes mounted at the same path (or at /dev/shm, which --shm-size owns)")
    caches = {v.cache for v in out if v.cache}
    if len(caches) > 1:
        raise ConfigError("--volume", "gcs: the pod has one file cache volume (gke-gcsfuse-cache): give every bucket "
                          "the same :cache=")
    if caches and any(v.cache and not v.size and "file-cache:max-size-mb" not in (v.mount_options or "")
                      for v in out):
        raise ConfigError("--volume", "gcs: :cache= places the file cache, which is off until :file-cache=SIZE (or "
                          "the mount option file-cache:max-size-mb) turns it on")
    return tuple(out)


def cache_volumes(volumes: tuple[Volume, ...]) -> list[dict[str, Any]]:
    """The Cloud Storage FUSE sidecar's file cache volume where :cache= asks for one: memory, or Local SSD."""
    cached = [v for v in volumes if v.cache]
    if not cached:
        return []
    sizes = [v.size for v in cached]
    size = sizes[0] if len(cached) == 1 and sizes[0] != "-1" else None  # one bucket's bound is the volume's
    return [{"name": GCSFUSE_CACHE, "emptyDir": empty_dir(cached[0].cache or "", size)}]


def node_labels(volumes: tuple[Volume, ...]) -> dict[str, str]:
    """The node labels the volumes need: Local SSD ephemeral storage for a local-ssd emptyDir or file cache."""
    local_ssd = any((v.source if v.kind == "emptydir" else v.cache) == "local-ssd" for v in volumes)
    return dict([LOCAL_SSD_NODES]) if local_ssd else {}


def pod_annotations(volumes: tuple[Volume, ...]) -> dict[str, str]:
    """The pod annotations the volumes need: GKE's Cloud Storage FUSE webhook looks for gke-gcsfuse/volumes; a file
    cache the sidecar fills gets the sidecar's resources sized to hold it (``sidecar_needs``)."""
    if not any(v.kind == "gcs" for v in volumes):
        return {}
    return {**dict([GCSFUSE_ANNOTATION]), **{k: _text(need) for k, need in sidecar_needs(volumes).items()}}


def sidecar_needs(volumes: tuple[Volume, ...]) -> dict[str, int]:
    """The sidecar limits (and requests) a file cache needs, in bytes (0: no limit, for an unbounded cache).

    The driver's sidecar writes the cache. By default it is an emptyDir on the node's ephemeral storage charged to the
    sidecar, whose limit must be "larger than the fileCacheCapacity volume attribute" (GoogleCloudPlatform/
    gcs-fuse-csi-driver, docs/troubleshooting.md: "the value of Pod annotation gke-gcsfuse/ephemeral-storage-limit");
    with ``cache=memory`` the cache volume is a tmpfs, whose pages are the sidecar's memory. Each gets its default (5Gi
    of ephemeral storage, 256Mi of memory: the webhook's defaults) on top. ``cache=local-ssd`` is a pod volume of its
    own, bounded by its sizeLimit."""
    cached = [v for v in volumes if v.kind == "gcs" and v.size]
    needs: dict[str, int] = {}
    for medium, (limit, request, default) in (("", SIDECAR_DISK), ("memory", SIDECAR_MEMORY)):
        sizes = [v.size for v in cached if (v.cache or "") == medium]
        if not sizes:
            continue
        total = 0 if "-1" in sizes else sum(_bytes(q) for q in sizes if q) + default
        needs[limit] = total
        if total:
            needs[request] = total  # scheduled where it fits, not on the default request alone
    return needs


def check_sidecar(annotations: dict[str, str], volumes: tuple[Volume, ...], where: str = "") -> None:
    """A sidecar limit given with --pod-annotation below what its file cache holds is refused: the sidecar would be
    killed (memory) or evicted (ephemeral storage) when the cache fills."""
    for key, need in sidecar_needs(volumes).items():
        given = annotations.get(key, "")
        if key.endswith("-limit") and need and given not in ("0", _text(need)) and _SIZE.fullmatch(given) and \
                _bytes(given) < need:
            raise ConfigError("--pod-annotation", f"{where}{key} is below what the file cache holds plus the sidecar's "
                              f"own ({_text(need)}): the sidecar would be killed when the cache fills")


def _bytes(quantity: str) -> int:
    match = _SIZE.fullmatch(quantity)
    if match is None:
        return 0
    units = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20,
             "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    return int(float(match[1]) * units.get(match[3] or "", 1))


def _text(size: int) -> str:
    """Bytes as a quantity people read: whole Gi when exact, else Mi rounded up (``0``: no limit)."""
    if size == 0:
        return "0"
    return f"{size // 2**30}Gi" if size % 2**30 == 0 else f"{-(-size // 2**20)}Mi"
