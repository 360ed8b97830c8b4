"""``job kubeflow --node-fabric``: the pod pieces of each GPU fabric, matched field by field against what the public
recipes write (the expected values below were read off AI-Hypercomputer/gpu-recipes'
src/helm-charts/a3mega/jobset and a3ultra/jobset workload templates and GoogleCloudPlatform/
container-engine-accelerators' gpudirect-tcpx/nccl-test-latest.yaml; none is read at test time)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from entrypoint.cluster import fabric
from tests.jobspecs.helpers import TORCH_IMAGE, job, kubeflow_model, one_line_error

pytestmark = pytest.mark.jobs
RUN = ["--", "--module", "m"]
NVIDIA = [f"/dev/nvidia{i}" for i in range(8)] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]


def pod(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2",
                         "--gpus", "8", *argv, *RUN)
    assert code == 0, err
    template: dict[str, Any] = yaml.safe_load(out)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    return template


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def interfaces(template: dict[str, Any]) -> list[dict[str, str]]:
    annotations = template["metadata"]["annotations"]
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    found: list[dict[str, str]] = json.loads(annotations["networking.gke.io/interfaces"])
    return found


def devices(template: dict[str, Any], container: str) -> list[str]:
    text = template["metadata"]["annotations"][f"devices.gke.io/container.{container}"]
    return [entry["path"] for entry in yaml.safe_load(text)]


def test_gib_as_gpu_recipes_a3ultra(capsys: pytest.CaptureFixture[str]) -> None:
    template = pod(capsys, "--node-fabric", "gib", "--fabric-installer-image", "installer:v1")
    assert interfaces(template) == [{"interfaceName": "eth0", "network": "default"},
                                    {"interfaceName": "eth1", "network": "gvnic-1"},
                                    *({"interfaceName": f"eth{i + 2}", "network": f"rdma-{i}"} for i in range(8))]
    spec = template["spec"]
    assert by_name(spec["volumes"])["gib"] == {"name": "gib", "emptyDir": {}}
    (installer,) = spec["initContainers"]
    assert installer["name"] == "nccl-plugin-installer" and installer["image"] == "installer:v1"
    assert installer["command"] == ["/bin/sh", "-c"]
    assert installer["args"][0].splitlines() == ["set -ex", "/scripts/container_entry.sh install --install-nccl",
                                                 "cp -R /var/lib/gib/lib64/. /target/usr/local/gib/lib64",
                                                 "cp -R /var/lib/gib/. /target/usr/local/gib"]
    assert installer["volumeMounts"] == [{"mountPath": "/target/usr/local/gib", "name": "gib"}]
    (training,) = spec["containers"]
    assert {"name": "gib", "mountPath": "/usr/local/gib"} in training["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in training["volumeMounts"]


def test_tcpxo_as_gpu_recipes_a3mega(capsys: pytest.CaptureFixture[str]) -> None:
    template = pod(capsys, "--node-fabric", "tcpxo", "--fabric-installer-image", "installer:v1",
                   "--rxdm-image", "rxdm:v1")
    assert interfaces(template) == [{"interfaceName": "eth0", "network": "default"},
                                    *({"interfaceName": f"eth{i}", "network": f"vpc{i}"} for i in range(1, 9))]
    assert devices(template, "tcpxo-daemon") == [*NVIDIA, "/dev/dmabuf_import_helper"]
    spec = template["spec"]
    volumes = by_name(spec["volumes"])
    assert volumes["libraries"]["hostPath"] == {"path": "/home/kubernetes/bin/nvidia"}
    assert volumes["sys"]["hostPath"] == {"path": "/sys"} and volumes["proc-sys"]["hostPath"] == {"path": "/proc/sys"}
    assert volumes["aperture-devices"]["hostPath"] == {"path": "/dev/aperture_devices"}
    assert volumes["nccl-plugin-volume"] == {"name": "nccl-plugin-volume", "emptyDir": {}}
    installer, daemon = spec["initContainers"]
    assert installer["name"] == "nccl-plugin-installer" and installer["command"][:2] == ["/bin/sh", "-c"]
    assert "cp -r /var/lib/tcpxo/* /usr/local/nccl-plugin/" in installer["command"][2]
    assert installer["volumeMounts"] == [{"name": "nccl-plugin-volume", "mountPath": "/usr/local/nccl-plugin"}]
    assert daemon["name"] == "tcpxo-daemon" and daemon["image"] == "rxdm:v1" and daemon["restartPolicy"] == "Always"
    assert daemon["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_BIND_SERVICE"]
    assert by_name(daemon["volumeMounts"]) == {
        "libraries": {"name": "libraries", "mountPath": "/usr/local/nvidia"},
        "sys": {"name": "sys", "mountPath": "/hostsysfs"},
        "proc-sys": {"name": "proc-sys", "mountPath": "/hostprocsysfs"}}
    assert daemon["env"] == [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}]
    assert "/fts/entrypoint_rxdm_container.sh --num_hops=2 --num_nics=8 --uid= --alsologtostderr" in \
        daemon["command"][2]
    (training,) = spec["containers"]
    assert {"name": "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY", "value": "/dev/aperture_devices"} in training["env"]
    mounts = by_name(training["volumeMounts"])
    assert mounts["nccl-plugin-volume"]["mountPath"] == "/usr/local/nccl-plugin"
    assert mounts["aperture-devices"]["mountPath"] == "/dev/aperture_devices"
    assert not any(e["name"].startswith("NCCL_") and e["name"] != "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"
                   for e in training["env"])  # the host's profile gives those, at run time


def test_tcpx_as_container_engine_accelerators(capsys: pytest.CaptureFixture[str]) -> None:
    template = pod(capsys, "--node-fabric", "tcpx", "--rxdm-image", "rxdm:v2")
    assert interfaces(template) == [{"interfaceName": "eth0", "network": "default"},
                                    *({"interfaceName": f"eth{i}", "network": f"vpc{i}"} for i in range(1, 5))]
    assert devices(template, "tcpx-daemon") == NVIDIA
    spec = template["spec"]
    volumes = by_name(spec["volumes"])
    assert volumes["libraries"]["hostPath"] == {"path": "/home/kubernetes/bin/nvidia/lib64"}
    assert volumes["tcpx-socket"]["hostPath"] == {"path": "/run/tcpx"}
    assert volumes["sys"]["hostPath"] == {"path": "/sys"} and volumes["proc"]["hostPath"] == {"path": "/proc/sys"}
    (daemon,) = spec["initContainers"]
    assert daemon["name"] == "tcpx-daemon" and daemon["restartPolicy"] == "Always"  # a native sidecar here
    assert daemon["command"][:7] == ["/tcpgpudmarxd/build/app/tcpgpudmarxd", "--gpu_nic_preset", "a3vm",
                                     "--gpu_shmem_type", "fd", "--uds_path", "/run/tcpx"]
    assert daemon["securityContext"]["capabilities"]["add"] == ["NET_ADMIN"]
    assert by_name(daemon["volumeMounts"])["tcpx-socket"]["mountPath"] == "/run/tcpx"
    (training,) = spec["containers"]
    assert training["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert {"name": "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "value": "/run/tcpx"} in training["env"]


def test_the_pods_mount_the_plugin_where_the_fabric_step_looks(capsys: pytest.CaptureFixture[str]) -> None:
    profiles = {lay.fabric: lay.profile for lay in fabric.LAYOUTS}
    gib = pod(capsys, "--node-fabric", "gib", "--fabric-installer-image", "i:1")["spec"]["containers"][0]
    assert any(str(profiles["gib"]).startswith(m["mountPath"] + "/") for m in gib["volumeMounts"])
    tcpxo = pod(capsys, "--node-fabric", "tcpxo", "--fabric-installer-image", "i:1", "--rxdm-image", "r:1")
    mounted = [m["mountPath"] for m in tcpxo["spec"]["containers"][0]["volumeMounts"]]
    assert any(lay.profile and lay.profile.startswith(m + "/") for lay in fabric.LAYOUTS for m in mounted)


def test_the_users_env_and_networks_win(capsys: pytest.CaptureFixture[str]) -> None:
    template = pod(capsys, "--node-fabric", "tcpx", "--rxdm-image", "r:1", "--env",
                   "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=/sockets", "--fabric-networks", "a,b,c,d")
    env = template["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"] == [
        {"name": "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "value": "/sockets"}]
    assert [i["network"] for i in interfaces(template)] == ["default", "a", "b", "c", "d"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--node-fabric", "gib"], "--fabric-installer-image: --node-fabric gib needs the plugin installer's image"),
    (["--node-fabric", "tcpxo", "--fabric-installer-image", "i:1"], "--rxdm-image: --node-fabric tcpxo needs"),
    (["--rxdm-image", "r:1"], "--rxdm-image: only with --node-fabric"),
    (["--node-fabric", "tcpx", "--rxdm-image", "r:1", "--fabric-networks", "a,b"], "4 networks after eth0, 2 given"),
])
def test_bad_fabric_options_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    code, _, err = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, *argv, *RUN)
    assert expected in one_line_error(code, err)


def test_a_trainjob_cannot_carry_the_fabric(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = job(capsys, "kubeflow", "--kind", "trainjob", "--image", TORCH_IMAGE, "--node-fabric", "tcpx",
                       "--rxdm-image", "r:1", *RUN)
    assert "--node-fabric: a TrainJob's runtime patch cannot set it" in one_line_error(code, err)


@pytest.mark.parametrize("argv", [
    ["--node-fabric", "gib", "--fabric-installer-image", "i:1"],
    ["--node-fabric", "tcpxo", "--fabric-installer-image", "i:1", "--rxdm-image", "r:1"],
    ["--node-fabric", "tcpx", "--rxdm-image", "r:1"],
])
def test_each_fabrics_pytorchjob_is_one_the_sdk_reads_back_whole(capsys: pytest.CaptureFixture[str],
                                                                  argv: list[str]) -> None:
    code, out, err = job(capsys, "kubeflow", "--kind", "pytorchjob", "--image", TORCH_IMAGE, "--workers", "2",
                         "--gpus", "8", *argv, *RUN)
    assert code == 0, err
    kubeflow_model(yaml.safe_load(out))


def test_a_ps_off_the_gpu_nodes_gets_no_fabric(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = job(capsys, "kubeflow", "--kind", "tfjob", "--image", TORCH_IMAGE.replace("pytorch", "tensorflow"),
                         "--workers", "2", "--ps", "1", "--gpus", "8", "--node-fabric", "gib",
                         "--fabric-installer-image", "i:1", *RUN)
    assert code == 0, err
    specs = yaml.safe_load(out)["spec"]["tfReplicaSpecs"]
    assert "initContainers" not in specs["PS"]["template"]["spec"]
    assert "initContainers" in specs["Worker"]["template"]["spec"]
