"""Reduction Server sizing: the training VMs' general-purpose bandwidth, the reducers', and Google's reducer image.

Sources (public Google Cloud documentation, read 2026):
- https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth ("Networking and GPU machines"): per machine
  type, the total bandwidth and how it splits between general-purpose NICs (gVNIC / Titanium) and the NICs
  dedicated to GPU-to-GPU traffic (CX-7 on A3 Ultra and A4, GPUDirect-TCPX(O) on A3 High and Mega), which
  "can't be used for other networking needs": a reducer is a CPU VM, reached over the general-purpose NICs
  only. N1 with P100 or P4 gets "the maximum rate available to N1 instances that don't have GPUs attached".
- https://cloud.google.com/compute/docs/network-bandwidth (N1/N2 egress: 2 Gbps per vCPU, at most 32 Gbps
  on the default tier).
- Reduction Server: images, "n1-highcpu-16 / n2-highcpu-16 at 32 Gbps egress" and the sizing rule (reducers'
  total bandwidth >= the training nodes'):
  https://cloud.google.com/vertex-ai/docs/training/distributed-training#reduce_training_time_with_reduction_server
"""

from __future__ import annotations

import math
import re

from entrypoint.jobs.images import parse_image
from entrypoint.jobs.machines import family, vcpus

BANDWIDTH_SOURCE = "https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth"

# Accelerator-optimized types: (total Gbps, general-purpose Gbps a reducer can be reached on).
# a3-highgpu-8g: 5 NICs x 200, 4 for GPU traffic; a3-megagpu-8g: 8+1 NICs x 200; A3 Ultra / A4: 8 CX-7 NICs
# (3,200 Gbps, GPU to GPU only) + 2 gVNICs (400 Gbps). The others have one NIC carrying everything.
GPU_MACHINE_BANDWIDTH: dict[str, tuple[int, int]] = {
    "a2-highgpu-1g": (24, 24), "a2-highgpu-2g": (32, 32), "a2-highgpu-4g": (50, 50), "a2-highgpu-8g": (100, 100),
    "a2-megagpu-16g": (100, 100),
    "a2-ultragpu-1g": (24, 24), "a2-ultragpu-2g": (32, 32), "a2-ultragpu-4g": (50, 50), "a2-ultragpu-8g": (100, 100),
    "a3-highgpu-1g": (25, 25), "a3-highgpu-2g": (50, 50), "a3-highgpu-4g": (100, 100),
    "a3-highgpu-8g": (1000, 200), "a3-megagpu-8g": (1800, 200), "a3-ultragpu-8g": (3600, 400),
    "a4-highgpu-8g": (3600, 400),
    "g2-standard-4": (10, 10), "g2-standard-8": (16, 16), "g2-standard-12": (16, 16), "g2-standard-16": (32, 32),
    "g2-standard-24": (32, 32), "g2-standard-32": (32, 32), "g2-standard-48": (50, 50), "g2-standard-96": (100, 100),
}
N1_V100_FULL = (8, 96, 100)  # 8 V100 on 96 vCPUs: 100 Gbps (the Vertex guide's sizing example)
N1_DEFAULT_RATE = ("NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4")  # as an N1 without GPUs

# Reducer machines: general-purpose egress is 2 Gbps per vCPU, at most 32 Gbps (default tier).
REDUCER_FAMILIES = ("n1", "n2")
DEFAULT_REDUCER_MACHINE = "n1-highcpu-16"
REDUCTION_SERVER_IMAGES = {
    "us": "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
    "europe": "europe-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
    "asia": "asia-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest",
}


def cpu_egress(machine_type: str) -> int | None:
    """N1/N2 egress without GPUs: 2 Gbps per vCPU, at most 32 (None for other families)."""
    cpus = vcpus(machine_type)
    if family(machine_type) not in REDUCER_FAMILIES or cpus is None:
        return None
    return min(2 * cpus, 32)


def training_bandwidth(machine_type: str, accelerator: tuple[str, int] | None) -> int | None:
    """General-purpose network bandwidth (Gbps) of one training VM, where documented: what reducers can use."""
    if machine_type in GPU_MACHINE_BANDWIDTH:
        return GPU_MACHINE_BANDWIDTH[machine_type][1]
    if accelerator is None or family(machine_type) != "n1":
        return None
    kind, count = accelerator
    if kind in N1_DEFAULT_RATE:
        return cpu_egress(machine_type)
    if kind == "NVIDIA_TESLA_V100" and (count, vcpus(machine_type)) == N1_V100_FULL[:2]:
        return N1_V100_FULL[2]
    return None


def reducer_bandwidth(machine_type: str) -> int | None:
    """Egress bandwidth (Gbps) of a CPU-only N1/N2 reducer."""
    return cpu_egress(machine_type)


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


def carries_plugin(image_uri: str) -> bool:
    """Whether the image's name or tag says it was built with the Reduction Server NCCL plugin.

    Our builds with ``REDUCTION_SERVER=1`` are tagged ``...-rs`` (docs/images.md); a CPU variant never has it.
    """
    image = parse_image(image_uri)
    if image.cpu:
        return False
    words = re.split(r"[-_.]", f"{image.name}-{image.tag}".lower())
    return "rs" in words or "reductionserver" in words or "reduction" in words
