"""The pod pieces of Google's GPU fabric for ``job kubeflow --node-fabric tcpx|tcpxo|gib`` (docs/fabric.md).

Laid out field by field as the public recipes do (tests/jobspecs/test_fabric_pods.py holds the fields read off
them): TCPXO and gIB as AI-Hypercomputer/gpu-recipes' a3mega and a3ultra JobSet templates (the plugin installer
init container and its shared volume, the RxDM sidecar as a native sidecar with its devices and capabilities, the
multi-network annotations), TCPX as GoogleCloudPlatform/container-engine-accelerators' gpudirect-tcpx test pod (its
installer is a DaemonSet there; its RxDM, a plain container there, is a native sidecar here so that a Job's pod
ends). The image's own fabric step sources the host's profile, so no NCCL variable is copied here; the images of
the installer and RxDM are the user's (``--fabric-installer-image``, ``--rxdm-image``): they go with the cluster's
GKE version (the release notes), so none is pinned here.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError
from entrypoint.jobs.kubeflow.placement import NodeTerm

FABRICS = ("tcpx", "tcpxo", "gib")
INSTALLER = "nccl-plugin-installer"
RXDM = {"tcpx": "tcpx-daemon", "tcpxo": "tcpxo-daemon"}
# The networks of the GPU NICs the recipes attach (eth1...), after eth0 on "default": a cluster's own names differ.
NETWORKS = {"tcpx": tuple(f"vpc{i}" for i in range(1, 5)), "tcpxo": tuple(f"vpc{i}" for i in range(1, 9)),
            "gib": ("gvnic-1", *(f"rdma-{i}" for i in range(8)))}
NVIDIA_DEVICES = (*(f"/dev/nvidia{i}" for i in range(8)), "/dev/nvidiactl", "/dev/nvidia-uvm")
RELEASES = {"tcpx": "container-engine-accelerators' gpudirect-tcpx manifests",
            "tcpxo": "the GPUDirect-TCPXO release notes (container-engine-accelerators/gpudirect-tcpxo)",
            "gib": "the NCCL/gIB release notes (docs.cloud.google.com/ai-hypercomputer/docs/nccl)"}
TCPX_SOCKETS = "/run/tcpx"
_TCPXO_INSTALL = ("set -ex\n/scripts/container_entry.sh install --install-nccl\n"
                  "cp -r /var/lib/tcpxo/* /usr/local/nccl-plugin/\n")
_GIB_INSTALL = ("set -ex\n/scripts/container_entry.sh install --install-nccl\n"
                "cp -R /var/lib/gib/lib64/. /target/usr/local/gib/lib64\ncp -R /var/lib/gib/. /target/usr/local/gib\n")
_TCPXO_RXDM = ('cleanup() {\n  echo "Received SIGTERM, exiting RxDM"\n  if [ -n "$child_pid" ]; then\n'
               '    kill -TERM "$child_pid"\n  fi\n  exit 0\n}\ntrap cleanup SIGTERM\n'
               "chmod 755 /fts/entrypoint_rxdm_container.sh\n"
               "/fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics=8 --uid= --alsologtostderr & "
               'child_pid=$!\nwait "$child_pid"\n')
_TCPX_RXDM = ["/tcpgpudmarxd/build/app/tcpgpudmarxd", "--gpu_nic_preset", "a3vm", "--gpu_shmem_type", "fd",
              "--uds_path", TCPX_SOCKETS, "--setup_param", '\\"--verbose 128 2 0 \\"']


@dataclass(frozen=True)
class FabricPods:
    fabric: str
    installer_image: str | None = None  # TCPXO, gIB: the plugin installer (its init container)
    rxdm_image: str | None = None  # TCPX, TCPXO: the RxDM daemon (its sidecar)
    networks: tuple[str, ...] = ()  # the GPU NICs' networks, eth1 onwards


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--node-fabric", choices=FABRICS, help="the node pool's GPU fabric: the pod pieces Google's "
                   "recipes use (tcpx: A3 High, tcpxo: A3 Mega, gib: A3 Ultra / A4; docs/fabric.md)")
    g.add_argument("--fabric-installer-image", metavar="IMAGE", help="TCPXO / gIB: the NCCL plugin installer image "
                   "(its release notes name the one for your GKE version)")
    g.add_argument("--rxdm-image", metavar="IMAGE", help="TCPX / TCPXO: the RxDM daemon image")
    g.add_argument("--fabric-networks", metavar="NET,NET,...", help="the GKE networks of the GPU NICs, eth1 "
                   "onwards (default: the recipes' vpc1..vpc4 (tcpx), vpc1..vpc8 (tcpxo), gvnic-1,rdma-0..rdma-7)")


def from_namespace(ns: argparse.Namespace) -> FabricPods | None:
    """The fabric's pieces asked for (None: none); a missing image is a ConfigError naming where to find it."""
    fabric = getattr(ns, "node_fabric", None)
    if fabric is None:
        given = [f for f, v in (("--fabric-installer-image", ns.fabric_installer_image),
                                ("--rxdm-image", ns.rxdm_image), ("--fabric-networks", ns.fabric_networks)) if v]
        if given:
            raise ConfigError(", ".join(given), "only with --node-fabric tcpx|tcpxo|gib")
        return None
    if fabric in ("tcpxo", "gib") and not ns.fabric_installer_image:
        raise ConfigError("--fabric-installer-image", f"--node-fabric {fabric} needs the plugin installer's image "
                          f"(see {RELEASES[fabric]})")
    if fabric in RXDM and not ns.rxdm_image:
        raise ConfigError("--rxdm-image", f"--node-fabric {fabric} needs the RxDM daemon's image (see "
                          f"{RELEASES[fabric]})")
    networks = tuple(n.strip() for n in (ns.fabric_networks or "").split(",") if n.strip()) or NETWORKS[fabric]
    if len(networks) != len(NETWORKS[fabric]):
        raise ConfigError("--fabric-networks", f"{fabric} attaches {len(NETWORKS[fabric])} networks after eth0, "
                          f"{len(networks)} given")
    return FabricPods(fabric, ns.fabric_installer_image if fabric != "tcpx" else None, ns.rxdm_image, networks)


# The nodes each fabric is for, as GKE labels them (cloud.google.com/gke-accelerator; node.kubernetes.io/instance-type):
# a pod selecting them without --node-fabric gets none of the fabric's pieces, and NCCL falls back to the general NIC.
FABRIC_NODES = {"nvidia-h100-mega-80gb": "tcpxo", "a3-megagpu-8g": "tcpxo", "nvidia-h200-141gb": "gib",
                "a3-ultragpu-8g": "gib", "nvidia-b200": "gib", "a4-highgpu-8g": "gib", "a3-highgpu-8g": "tcpx"}
NODE_LABELS = ("cloud.google.com/gke-accelerator", "node.kubernetes.io/instance-type")


def fabric_for(node_selector: tuple[tuple[str, str], ...], node_affinity: tuple[NodeTerm, ...] = ()) -> str | None:
    """The fabric of the nodes the pods may land on (A3 High 8g, A3 Mega, A3 Ultra, A4), or None: a node selector,
    or a required node affinity expression ``In`` those labels (``--node-affinity KEY=V1,V2``)."""
    required = [(k, v) for k, op, values, weight in node_affinity if weight is None and op == "In" for v in values]
    return next((FABRIC_NODES[v] for k, v in (*node_selector, *required) if k in NODE_LABELS and v in FABRIC_NODES),
                None)


def runtime_pieces(fabric: str) -> str:
    """What a TrainJob's runtime must carry for ``fabric`` (a TrainJob's runtime patch cannot add them)."""
    installer = ["the NCCL plugin installer init container and its volume"] if fabric != "tcpx" else []
    rxdm = [f"the RxDM sidecar ({RXDM[fabric]}) with its GPU devices"] if fabric in RXDM else []
    rxdm += [f"{TCPX_SOCKETS} shared with the trainer, which needs IPC_LOCK"] if fabric == "tcpx" else []
    nics = [f"the multi-network annotations (networking.gke.io/interfaces) for its {len(NETWORKS[fabric])} GPU NICs"]
    return ", ".join(installer + rxdm + nics)


def check_collisions(fp: FabricPods, mount_paths: list[str], volume_names: list[str], secret_envs: list[str],
                     where: str = "") -> None:
    """A --volume or --env-secret the fabric's pieces already are: the API server refuses a pod with two volumes of
    one name or two mounts at one path, and two entries of one variable make the operator's update fight itself."""
    mine = {m["mountPath"] for m in mounts(fp)}
    taken = sorted(p for p in mount_paths if p in mine or any(p.startswith(f"{m}/") for m in mine))
    if taken:
        raise ConfigError("--volume", f"{where}{taken[0]} is where --node-fabric {fp.fabric} mounts its own volume")
    names = {v["name"] for v in volumes(fp)} & set(volume_names)
    if names:
        raise ConfigError("--volume", f"{where}{sorted(names)[0]} is the name of a --node-fabric {fp.fabric} volume")
    fabric_env = {e["name"] for e in env(fp)} & set(secret_envs)
    if fabric_env:
        raise ConfigError("--env-secret", f"{where}{sorted(fabric_env)[0]} is set by --node-fabric {fp.fabric} (where "
                          "the plugin finds RxDM): give it once")


def pod_annotations(fp: FabricPods) -> dict[str, str]:
    """The multi-network annotations, and the GPU devices the RxDM sidecar gets (GKE's device annotation)."""
    interfaces = [{"interfaceName": "eth0", "network": "default"},
                  *({"interfaceName": f"eth{i}", "network": n} for i, n in enumerate(fp.networks, start=1))]
    out = {"networking.gke.io/default-interface": "eth0", "networking.gke.io/interfaces": json.dumps(interfaces)}
    if fp.fabric in RXDM:
        devices = NVIDIA_DEVICES + (("/dev/dmabuf_import_helper",) if fp.fabric == "tcpxo" else ())
        out[f"devices.gke.io/container.{RXDM[fp.fabric]}"] = "".join(f"- path: {d}\n" for d in devices)
    return out


def _host(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path}}


def volumes(fp: FabricPods) -> list[dict[str, Any]]:
    if fp.fabric == "gib":
        return [{"name": "gib", "emptyDir": {}}]
    if fp.fabric == "tcpxo":
        return [_host("libraries", "/home/kubernetes/bin/nvidia"), _host("sys", "/sys"),
                _host("proc-sys", "/proc/sys"), _host("aperture-devices", "/dev/aperture_devices"),
                {"name": "nccl-plugin-volume", "emptyDir": {}}]
    return [_host("libraries", "/home/kubernetes/bin/nvidia/lib64"), _host("tcpx-socket", TCPX_SOCKETS),
            _host("sys", "/sys"), _host("proc", "/proc/sys")]


def init_containers(fp: FabricPods) -> list[dict[str, Any]]:
    """The plugin installer (TCPXO, gIB), then RxDM as a native sidecar (TCPX, TCPXO)."""
    out: list[dict[str, Any]] = []
    if fp.fabric == "gib":
        out.append({"name": INSTALLER, "image": fp.installer_image, "command": ["/bin/sh", "-c"],
                    "args": [_GIB_INSTALL], "volumeMounts": [{"name": "gib", "mountPath": "/target/usr/local/gib"}]})
    elif fp.fabric == "tcpxo":
        out.append({"name": INSTALLER, "image": fp.installer_image, "command": ["/bin/sh", "-c", _TCPXO_INSTALL],
                    "volumeMounts": [{"name": "nccl-plugin-volume", "mountPath": "/usr/local/nccl-plugin"}]})
        out.append({"name": RXDM["tcpxo"], "image": fp.rxdm_image, "restartPolicy": "Always",
                    "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_BIND_SERVICE"]}},
                    "volumeMounts": [{"name": "libraries", "mountPath": "/usr/local/nvidia"},
                                     {"name": "sys", "mountPath": "/hostsysfs"},
                                     {"name": "proc-sys", "mountPath": "/hostprocsysfs"}],
                    "env": [{"name": ev.LD_LIBRARY_PATH, "value": "/usr/local/nvidia/lib64"}],
                    "command": ["bash", "-c", _TCPXO_RXDM]})
    else:
        out.append({"name": RXDM["tcpx"], "image": fp.rxdm_image, "restartPolicy": "Always",
                    "command": list(_TCPX_RXDM), "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
                    "volumeMounts": [{"name": "libraries", "mountPath": "/usr/local/nvidia/lib64"},
                                     {"name": "tcpx-socket", "mountPath": TCPX_SOCKETS},
                                     {"name": "sys", "mountPath": "/hostsysfs"},
                                     {"name": "proc", "mountPath": "/hostprocsysfs"}],
                    "env": [{"name": ev.LD_LIBRARY_PATH, "value": "/usr/local/nvidia/lib64"}]})
    return out


def mounts(fp: FabricPods) -> list[dict[str, Any]]:
    """The training container's: where the fabric step looks (docs/fabric.md)."""
    if fp.fabric == "gib":
        return [{"name": "gib", "mountPath": "/usr/local/gib"}]
    if fp.fabric == "tcpxo":
        return [{"name": "nccl-plugin-volume", "mountPath": "/usr/local/nccl-plugin"},
                {"name": "aperture-devices", "mountPath": "/dev/aperture_devices"}]
    return [{"name": "tcpx-socket", "mountPath": TCPX_SOCKETS}]


def env(fp: FabricPods) -> list[dict[str, str]]:
    """Where the plugin finds RxDM (paths in the pod, not NCCL tuning: the host's profile gives that)."""
    if fp.fabric == "tcpxo":
        return [{"name": ev.NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY, "value": "/dev/aperture_devices"}]
    if fp.fabric == "tcpx":
        return [{"name": ev.NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX, "value": TCPX_SOCKETS}]
    return []


def security_context(fp: FabricPods) -> dict[str, Any] | None:
    """TCPX's workload locks memory (IPC_LOCK, as container-engine-accelerators' test pod)."""
    return {"capabilities": {"add": ["IPC_LOCK"]}} if fp.fabric == "tcpx" else None
