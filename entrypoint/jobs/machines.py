"""Machine facts the job builder checks against: GPUs per machine type, network bandwidth, reducer images.

Sources (public Google Cloud documentation, read 2026):
- Accelerator-optimized machine types, their attached GPUs and maximum network bandwidth:
  https://cloud.google.com/compute/docs/accelerator-optimized-machines and
  https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth ("Max total bandwidth" per machine type;
  N1 with P100/P4: 32 Gbps; N1 with 8 V100 on 96 vCPUs: 100 Gbps).
- GPUs that attach to N1 machines, and their counts: https://cloud.google.com/compute/docs/gpus
- Reduction Server: images, "n1-highcpu-16 / n2-highcpu-16 at 32 Gbps egress" and the sizing rule
  (reducers' total bandwidth >= the training nodes'):
  https://cloud.google.com/vertex-ai/docs/training/distributed-training#reduce_training_time_with_reduction_server
- Accelerator type names: the AcceleratorType enum of
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/MachineSpec
"""

from __future__ import annotations

import math

from entrypoint.errors import ConfigError

BANDWIDTH_SOURCE = "https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"

# MachineSpec.acceleratorType values (GPUs and TPUs) Vertex AI custom training accepts.
ACCELERATOR_TYPES = (
    "NVIDIA_TESLA_P100", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P4", "NVIDIA_TESLA_T4", "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB", "NVIDIA_L4", "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB",
    "NVIDIA_B200", "TPU_V2", "TPU_V3", "TPU_V4_POD", "TPU_V5_LITEPOD",
)

# Accelerator-optimized machine types: (GPU attached, how many, maximum total network bandwidth in Gbps).
# A3 High's 1,000 Gbps is 200 on its general-purpose NIC plus 800 on the GPU-to-GPU NICs.
GPU_MACHINES: dict[str, tuple[str, int, int]] = {
    "a2-highgpu-1g": ("NVIDIA_TESLA_A100", 1, 24),
    "a2-highgpu-2g": ("NVIDIA_TESLA_A100", 2, 32),
    "a2-highgpu-4g": ("NVIDIA_TESLA_A100", 4, 50),
    "a2-highgpu-8g": ("NVIDIA_TESLA_A100", 8, 100),
    "a2-megagpu-16g": ("NVIDIA_TESLA_A100", 16, 100),
    "a2-ultragpu-1g": ("NVIDIA_A100_80GB", 1, 24),
    "a2-ultragpu-2g": ("NVIDIA_A100_80GB", 2, 32),
    "a2-ultragpu-4g": ("NVIDIA_A100_80GB", 4, 50),
    "a2-ultragpu-8g": ("NVIDIA_A100_80GB", 8, 100),
    "a3-highgpu-1g": ("NVIDIA_H100_80GB", 1, 25),
    "a3-highgpu-2g": ("NVIDIA_H100_80GB", 2, 50),
    "a3-highgpu-4g": ("NVIDIA_H100_80GB", 4, 100),
    "a3-highgpu-8g": ("NVIDIA_H100_80GB", 8, 1000),
    "a3-megagpu-8g": ("NVIDIA_H100_MEGA_80GB", 8, 1800),
    "a3-ultragpu-8g": ("NVIDIA_H200_141GB", 8, 3600),
    "a4-highgpu-8g": ("NVIDIA_B200", 8, 3600),
    "g2-standard-4": ("NVIDIA_L4", 1, 10),
    "g2-standard-8": ("NVIDIA_L4", 1, 16),
    "g2-standard-12": ("NVIDIA_L4", 1, 16),
    "g2-standard-16": ("NVIDIA_L4", 1, 32),
    "g2-standard-24": ("NVIDIA_L4", 2, 32),
    "g2-standard-32": ("NVIDIA_L4", 1, 32),
    "g2-standard-48": ("NVIDIA_L4", 4, 50),
    "g2-standard-96": ("NVIDIA_L4", 8, 100),
}

# GPUs that attach to N1 machine types, with the counts allowed.
N1_GPUS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
    "NVIDIA_TESLA_P100": (1, 2, 4),
    "NVIDIA_TESLA_P4": (1, 2, 4),
}
# N1 bandwidth with GPUs depends on GPU and vCPU count; these are the documented fixed points.
N1_GPU_BANDWIDTH = {"NVIDIA_TESLA_P100": 32, "NVIDIA_TESLA_P4": 32}
N1_V100_FULL = (8, 96, 100)  # 8 V100 on 96 vCPUs: 100 Gbps (the Vertex guide's example)

# Families that take no GPUs at all.
NO_GPU_FAMILIES = ("e2", "n2", "n2d", "n4", "c2", "c2d", "c3", "c3d", "c4", "t2d", "t2a", "m1", "m2", "m3")

# Reducer machines: general-purpose egress is 2 Gbps per vCPU, at most 32 Gbps (default tier).
REDUCER_FAMILIES = ("n1", "n2")
DEFAULT_REDUCER_MACHINE = "n1-highcpu-16"
REDUCTION_SERVER_IMAGES = {
    "us": "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
    "europe": "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
    "asia": "asia-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
}


def family(machine_type: str) -> str:
    """``n1`` for ``n1-standard-8``."""
    return machine_type.split("-", 1)[0]


def vcpus(machine_type: str) -> int | None:
    """The vCPU count at the end of a predefined machine type name, if it has one."""
    tail = machine_type.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def implied_accelerator(machine_type: str) -> tuple[str, int] | None:
    """The GPUs an accelerator-optimized machine type always comes with."""
    known = GPU_MACHINES.get(machine_type)
    return (known[0], known[1]) if known else None


def check_accelerator(flag: str, machine_type: str, accelerator: tuple[str, int] | None) -> None:
    """Raise ConfigError when the accelerator is impossible on the machine type (where known)."""
    if accelerator is None:
        if machine_type in GPU_MACHINES:
            raise ConfigError(flag, f"{machine_type} always has GPUs attached; leave the accelerator out or match it")
        return
    kind, count = accelerator
    if kind not in ACCELERATOR_TYPES:
        raise ConfigError(flag, f"unknown accelerator type; expected one of {', '.join(ACCELERATOR_TYPES)}")
    if count < 1:
        raise ConfigError(flag, "the accelerator count must be >= 1")
    fixed = GPU_MACHINES.get(machine_type)
    if fixed is not None:
        if (kind, count) != fixed[:2]:
            raise ConfigError(flag, f"{machine_type} comes with exactly {fixed[1]} x {fixed[0]}, not {count} x {kind}")
        return
    fam = family(machine_type)
    if fam == "n1" and kind.startswith("NVIDIA"):
        allowed = N1_GPUS.get(kind)
        if allowed is None:
            raise ConfigError(flag, f"{kind} does not attach to N1 machines; N1 takes {', '.join(N1_GPUS)}")
        if count not in allowed:
            raise ConfigError(flag, f"{count} x {kind} is not valid on {machine_type}: "
                              f"use {', '.join(map(str, allowed))}")
    elif fam in NO_GPU_FAMILIES:
        raise ConfigError(flag, f"{machine_type} takes no GPUs; use an N1, A2, A3 or G2 machine type")


def training_bandwidth(machine_type: str, accelerator: tuple[str, int] | None) -> int | None:
    """Maximum network bandwidth (Gbps) of one training VM, where documented."""
    if machine_type in GPU_MACHINES:
        return GPU_MACHINES[machine_type][2]
    if accelerator is None or family(machine_type) != "n1":
        return None
    kind, count = accelerator
    if kind in N1_GPU_BANDWIDTH:
        return N1_GPU_BANDWIDTH[kind]
    if kind == "NVIDIA_TESLA_V100" and (count, vcpus(machine_type)) == N1_V100_FULL[:2]:
        return N1_V100_FULL[2]
    return None


def reducer_bandwidth(machine_type: str) -> int | None:
    """Egress bandwidth (Gbps) of a CPU-only N1/N2 reducer: 2 Gbps per vCPU, at most 32."""
    cpus = vcpus(machine_type)
    if family(machine_type) not in REDUCER_FAMILIES or cpus is None:
        return None
    return min(2 * cpus, 32)


def reducers_needed(training_vms: int, per_vm_gbps: float, reducer_gbps: float) -> int:
    """The sizing rule: reducers' total bandwidth at least the training VMs' (8 x 100 / 32 -> 25)."""
    return max(1, math.ceil(training_vms * per_vm_gbps / reducer_gbps))


def reduction_server_image(region: str) -> str:
    """Google's reducer image from the multi-region closest to ``region``."""
    if region.startswith(("europe", "me-")):
        return REDUCTION_SERVER_IMAGES["europe"]
    if region.startswith(("asia", "australia")):
        return REDUCTION_SERVER_IMAGES["asia"]
    return REDUCTION_SERVER_IMAGES["us"]


def is_reduction_server(image_uri: str) -> bool:
    """Whether ``image_uri`` is Google's Reduction Server image (any multi-region or tag)."""
    return "/vertex-ai-restricted/training/reductionserver" in image_uri
