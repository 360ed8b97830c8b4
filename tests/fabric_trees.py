"""Fake host trees of Google's GPU machines, laid out as the public recipes mount them (docs/fabric.md), for the
fabric step's tests (unit: under a tmp root; containers: mounted at their real paths).

The paths are read off AI-Hypercomputer/gpu-recipes' a3mega, a3ultra and a4 workload templates and
GoogleCloudPlatform/container-engine-accelerators' gpudirect-tcpx, gpudirect-tcpxo and gpudirect-rdma manifests:
gIB's installer copies into the ``/usr/local/gib`` volume (``lib64``, ``scripts/set_nccl_env.sh``,
``configs/tuner_config_a3u.txtpb`` / ``tuner_config_a4.txtpb``); TCPXO's into ``/usr/local/nccl-plugin/lib64``
(gpu-recipes) with ``nccl-env-profile.sh``, ``a3plus_tuner_config.textproto``, ``a3plus_guest_config.textproto`` and
the workload mounts ``/dev/aperture_devices``; A3 Mega's Slurm prolog installs into ``/var/lib/tcpxo/lib64``; TCPX's
installer copies ``libnccl-net.so`` into the host's ``/usr/local/nvidia/lib64``. The profiles are ours: what they
export is what the tests expect to see passed on, exactly (their values are placeholders, not Google's).
"""

from __future__ import annotations

from pathlib import Path

TCPXO_PROFILE = """\
# fake nccl-env-profile.sh: reads NCCL_LIB_DIR as the real one does
echo "setting TCPXO variables"
export NCCL_FASTRAK_CTRL_DEV=eth0
export NCCL_FASTRAK_IFNAME=eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8
export NCCL_TUNER_PLUGIN=libnccl-tuner.so
export NCCL_TUNER_CONFIG_PATH=${NCCL_LIB_DIR}/a3plus_tuner_config.textproto
export NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE=${NCCL_LIB_DIR}/a3plus_guest_config.textproto
export NCCL_NVLSTREE_MAX_CHUNKSIZE=131072
export NCCL_FASTRAK_TEST_TOKEN=fake-token-value
"""
TCPXO_EXPORTS = {
    "NCCL_FASTRAK_CTRL_DEV": "eth0", "NCCL_FASTRAK_IFNAME": "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8",
    "NCCL_TUNER_PLUGIN": "libnccl-tuner.so", "NCCL_NVLSTREE_MAX_CHUNKSIZE": "131072",
    "NCCL_FASTRAK_TEST_TOKEN": "fake-token-value",
}


def gib_profile(machine: str) -> str:
    return f"""\
# fake set_nccl_env.sh
echo "gIB: {machine}" >&2
export NCCL_NET=gIB
export NCCL_CROSS_NIC=0
export NCCL_NET_GDR_LEVEL=PIX
export NCCL_TUNER_CONFIG_PATH=/usr/local/gib/configs/tuner_config_{machine}.txtpb
"""


def gib_exports(machine: str) -> dict[str, str]:
    return {"NCCL_NET": "gIB", "NCCL_CROSS_NIC": "0", "NCCL_NET_GDR_LEVEL": "PIX",
            "NCCL_TUNER_CONFIG_PATH": f"/usr/local/gib/configs/tuner_config_{machine}.txtpb"}


def _write(root: Path, path: str, text: str = "") -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _tcpxo(root: Path, lib: str) -> None:
    for name in ("libnccl-net.so", "libnccl-tuner.so", "a3plus_tuner_config.textproto",
                 "a3plus_guest_config.textproto"):
        _write(root, f"{lib}/{name}")
    _write(root, f"{lib}/nccl-env-profile.sh", TCPXO_PROFILE)
    (root / "dev/aperture_devices").mkdir(parents=True, exist_ok=True)
    if lib.startswith("/var/lib/"):  # a VM: the import-helper module's device is the host's own
        _write(root, "/dev/dmabuf_import_helper")


def _gib(root: Path, machine: str) -> None:
    _write(root, "/usr/local/gib/lib64/libnccl-net.so")
    _write(root, "/usr/local/gib/scripts/set_nccl_env.sh", gib_profile(machine))
    _write(root, f"/usr/local/gib/configs/tuner_config_{machine}.txtpb")
    (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)


# name -> (builder, the fabric found, its plugin dir, what its profile exports)
NODES = {
    "a3high-gke": (lambda r: _write(r, "/usr/local/nvidia/lib64/libnccl-net.so"), "tcpx", "/usr/local/nvidia/lib64",
                   {}),
    "a3mega-gke": (lambda r: _tcpxo(r, "/usr/local/nccl-plugin/lib64"), "tcpxo", "/usr/local/nccl-plugin/lib64",
                   TCPXO_EXPORTS),
    "a3mega-vm": (lambda r: _tcpxo(r, "/var/lib/tcpxo/lib64"), "tcpxo", "/var/lib/tcpxo/lib64", TCPXO_EXPORTS),
    "a3ultra": (lambda r: _gib(r, "a3u"), "gib", "/usr/local/gib/lib64", gib_exports("a3u")),
    "a4": (lambda r: _gib(r, "a4"), "gib", "/usr/local/gib/lib64", gib_exports("a4")),
    "plain": (lambda r: r.mkdir(parents=True, exist_ok=True), None, None, {}),
}


def expected_set(node: str, ld_library_path: str = "") -> dict[str, str]:
    """Exactly what the step sets on ``node`` (its profile's exports, the plugin dir first on LD_LIBRARY_PATH, and
    TCPXO's NCCL_LIB_DIR), given the LD_LIBRARY_PATH the node had."""
    _, fabric, plugin_dir, exports = NODES[node]
    if fabric is None:
        return {}
    found = dict(exports)
    if fabric == "tcpxo":
        found.update(NCCL_TUNER_CONFIG_PATH=f"{plugin_dir}/a3plus_tuner_config.textproto",
                     NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE=f"{plugin_dir}/a3plus_guest_config.textproto",
                     NCCL_LIB_DIR=str(plugin_dir))
    found["LD_LIBRARY_PATH"] = ":".join(p for p in (str(plugin_dir), ld_library_path) if p)
    return found


def build(root: Path, node: str) -> Path:
    NODES[node][0](root)
    return root
