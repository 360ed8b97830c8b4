"""Machine facts the job builder checks against: machine types, the GPUs they take, and which CUDA our images need.

Sources (public Google Cloud documentation, read 2026):
- Accelerator-optimized machine types and their attached GPUs:
  https://cloud.google.com/compute/docs/accelerator-optimized-machines
- GPUs that attach to N1 machines, and their counts: https://cloud.google.com/compute/docs/gpus
- Predefined machine types (family-class-vCPUs) and custom machine types (FAMILY-custom-VCPUS-MEMORY_MB,
  ``custom-VCPUS-MEMORY_MB`` for N1): https://cloud.google.com/compute/docs/machine-resource and
  https://cloud.google.com/compute/docs/instances/creating-instance-with-custom-machine-type
- Accelerator type names: the AcceleratorType enum of
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/MachineSpec (K80: end of support,
  https://cloud.google.com/compute/docs/eol/k80-eol)
- GPU architectures CUDA 13 dropped (Maxwell, Pascal, Volta: compute capability below 7.5):
  https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ ; compute capabilities per GPU:
  https://developer.nvidia.com/cuda-gpus
- N1 vCPUs and memory per GPU model and count ("GPUs for N1 general-purpose machine types"):
  https://cloud.google.com/compute/docs/gpus ; N1 memory per vCPU (standard 3.75 GB, highmem 6.5, highcpu 0.9):
  https://cloud.google.com/compute/docs/general-purpose-machines#n1_machines
- Boot disks: DiskSpec ("pd-ssd", "pd-standard" or "hyperdisk-balanced"; A3 Ultra defaults to Hyperdisk):
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/DiskSpec ; Hyperdisk per machine series (none on N1;
  A3 Ultra and A4 boot from Hyperdisk only): https://cloud.google.com/compute/docs/disks/hyperdisks and
  https://cloud.google.com/compute/docs/accelerator-optimized-machines
- A4X (a4x-highgpu-4g, 4 x GB200 on Arm Grace CPUs; "All training jobs must use a container image that is built
  for the ARM architecture"): https://cloud.google.com/vertex-ai/docs/training/training-clusters/compute-resources
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from entrypoint.errors import ConfigError

# MachineSpec.acceleratorType values (GPUs and TPUs) Vertex AI custom training knows.
ACCELERATOR_TYPES = (
    "NVIDIA_TESLA_K80", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P4", "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_L4", "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB", "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_RTX_PRO_6000",
    "TPU_V2", "TPU_V3", "TPU_V4_POD", "TPU_V5_LITEPOD",
)
# CUDA compute capability of each GPU (NVIDIA's table).
COMPUTE_CAPABILITY = {
    "NVIDIA_TESLA_K80": 3.7, "NVIDIA_TESLA_P100": 6.0, "NVIDIA_TESLA_P4": 6.1, "NVIDIA_TESLA_V100": 7.0,
    "NVIDIA_TESLA_T4": 7.5, "NVIDIA_TESLA_A100": 8.0, "NVIDIA_A100_80GB": 8.0, "NVIDIA_L4": 8.9,
    "NVIDIA_H100_80GB": 9.0, "NVIDIA_H100_MEGA_80GB": 9.0, "NVIDIA_H200_141GB": 9.0, "NVIDIA_B200": 10.0,
    "NVIDIA_GB200": 10.0, "NVIDIA_RTX_PRO_6000": 12.0,
}
# The oldest architecture each CUDA major version our GPU images are built on still runs.
CUDA_MIN_CAPABILITY = {13: 7.5, 12: 5.0}

# Accelerator-optimized machine types: the GPU attached and how many.
GPU_MACHINES: dict[str, tuple[str, int]] = {
    **{f"a2-highgpu-{n}g": ("NVIDIA_TESLA_A100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("NVIDIA_TESLA_A100", 16),
    **{f"a2-ultragpu-{n}g": ("NVIDIA_A100_80GB", n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": ("NVIDIA_H100_80GB", n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("NVIDIA_H100_MEGA_80GB", 8),
    "a3-ultragpu-8g": ("NVIDIA_H200_141GB", 8),
    "a4-highgpu-8g": ("NVIDIA_B200", 8),
    **{f"g2-standard-{v}": ("NVIDIA_L4", n) for v, n in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1),
                                                           (48, 4), (96, 8))},
}
GPU_FAMILIES = ("a2", "a3", "a4", "g2")

# GPUs that attach to N1 machine types, with the counts allowed.
N1_GPUS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
    "NVIDIA_TESLA_P100": (1, 2, 4),
    "NVIDIA_TESLA_P4": (1, 2, 4),
}

# Predefined general-purpose types: family -> class -> vCPU counts (Compute Engine's tables).
PREDEFINED: dict[str, dict[str, tuple[int, ...]]] = {
    "n1": {"standard": (1, 2, 4, 8, 16, 32, 64, 96), "highmem": (2, 4, 8, 16, 32, 64, 96),
           "highcpu": (2, 4, 8, 16, 32, 64, 96)},
    "n2": {"standard": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128), "highmem": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
           "highcpu": (2, 4, 8, 16, 32, 48, 64, 80, 96)},
    "e2": {"standard": (2, 4, 8, 16, 32), "highmem": (2, 4, 8, 16), "highcpu": (2, 4, 8, 16, 32)},
    "c2": {"standard": (4, 8, 16, 30, 60)},
}
# Families that take no GPUs at all.
NO_GPU_FAMILIES = ("e2", "n2", "n2d", "n4", "c2", "c2d", "c3", "c3d", "c4", "t2d", "t2a", "m1", "m2", "m3")
TPU_MACHINE_PREFIXES = ("cloud-tpu", "ct5lp-", "ct4p-", "ct5p-", "ct6e-")
# Arm (NVIDIA Grace) machines: our images are built for x86-64 only (images/*/requirements*.txt lock x86_64 wheels).
ARM_MACHINE_PREFIXES = ("a4x-",)
ARM_ACCELERATORS = ("NVIDIA_GB200",)

# N1 with GPUs: the most vCPUs and memory (GB) each GPU model and count allows.
N1_GPU_LIMITS: dict[str, dict[int, tuple[int, int]]] = {
    "NVIDIA_TESLA_T4": {1: (48, 312), 2: (48, 312), 4: (96, 624)},
    "NVIDIA_TESLA_V100": {1: (12, 78), 2: (24, 156), 4: (48, 312), 8: (96, 624)},
    "NVIDIA_TESLA_P4": {1: (24, 156), 2: (48, 312), 4: (96, 624)},
    "NVIDIA_TESLA_P100": {1: (16, 104), 2: (32, 208), 4: (96, 624)},
}
N1_GB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}

# Boot disk types a machine series cannot boot from (DiskSpec.bootDiskType).
HYPERDISK_ONLY = ("a3-ultragpu-", "a4-highgpu-")  # A3 Ultra, A4: Hyperdisk only
RDMA_MACHINES = ("a3-ultragpu-", "a4-highgpu-")  # GPU-to-GPU over CX-7 RDMA NICs with gIB (docs/fabric.md)
HYPERDISK_DEFAULT = ("a3-ultragpu-",)  # DiskSpec's default there is hyperdisk-balanced already
NO_HYPERDISK_FAMILIES = ("n1",)  # N1 (with or without GPUs) takes Persistent Disk only
HYPERDISK = "hyperdisk-balanced"

# Dynamic Workload Scheduler (scheduling.strategy FLEX_START) provisions these GPUs only: L4, A100, H100, H200, B200.
FLEX_START_GPUS = ("NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_H100_80GB", "NVIDIA_H100_MEGA_80GB",
                   "NVIDIA_H200_141GB", "NVIDIA_B200")

_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")
_CUSTOM = re.compile(r"(?:(?P<family>[a-z][a-z0-9]*)-)?custom-(?P<cpus>\d+)-(?P<mem>\d+)(?P<ext>-ext)?")


@dataclass(frozen=True)
class MachineType:
    """A machine type name read apart: ``n2-custom-8-16384`` is family n2, custom, 8 vCPUs, 16384 MB."""

    name: str
    family: str
    vcpus: int | None
    custom: bool = False
    memory_mb: int | None = None


def family(machine_type: str) -> str:
    """``n1`` for ``n1-standard-8`` (and for N1's ``custom-8-16384``)."""
    return parse_machine_type(machine_type).family


def parse_machine_type(name: str) -> MachineType:
    """Split a predefined or custom machine type name; vcpus is None where the name does not say."""
    custom = _CUSTOM.fullmatch(name)
    if custom:
        return MachineType(name, custom["family"] or "n1", int(custom["cpus"]), True, int(custom["mem"]))
    fam = name.split("-", 1)[0]
    tail = name.rsplit("-", 1)[-1]
    return MachineType(name, fam, int(tail) if tail.isdigit() else None)


def vcpus(machine_type: str) -> int | None:
    """The vCPU count a predefined or custom machine type name carries, if it has one."""
    return parse_machine_type(machine_type).vcpus


def check_machine_type(flag: str, name: str) -> list[str]:
    """Raise ConfigError for a machine type that cannot exist; return warnings for one this table does not know."""
    if name.startswith(TPU_MACHINE_PREFIXES):
        raise ConfigError(flag, f"{name} is a TPU machine type; our images have no TPU runtime (GPU or CPU only)")
    if name.startswith(ARM_MACHINE_PREFIXES):
        raise ConfigError(flag, f"{name} is A4X, whose CPUs are Arm (NVIDIA Grace): our images are built for x86-64 "
                          "and cannot run there")
    if not _NAME.fullmatch(name):
        raise ConfigError(flag, "is not a machine type name (e.g. n1-standard-8, a2-highgpu-1g)")
    machine = parse_machine_type(name)
    if machine.custom:
        return [f"{flag}: {name} is a custom machine type ({machine.vcpus} vCPUs, {machine.memory_mb} MB); "
                "Vertex AI training documents predefined machine types only and may refuse it"]
    if machine.family in GPU_FAMILIES:
        if name not in GPU_MACHINES:
            near = difflib.get_close_matches(name, GPU_MACHINES, n=3, cutoff=0.8)
            hint = f"did you mean {' or '.join(near)}?" if near else "see the accelerator-optimized machine types"
            raise ConfigError(flag, f"unknown {machine.family.upper()} machine type; {hint}")
        return []
    classes = PREDEFINED.get(machine.family)
    if classes is None:
        return [f"{flag}: {name} is not in this tool's machine tables; Vertex AI checks it when the job is created"]
    klass = name.split("-")[1] if name.count("-") == 2 else ""
    if klass not in classes or machine.vcpus not in classes[klass]:
        valid = "; ".join(f"{machine.family}-{k}-{{{','.join(map(str, v))}}}" for k, v in classes.items())
        raise ConfigError(flag, f"unknown {machine.family.upper()} machine type; predefined ones are {valid}")
    return []


def implied_accelerator(machine_type: str) -> tuple[str, int] | None:
    """The GPUs an accelerator-optimized machine type always comes with."""
    return GPU_MACHINES.get(machine_type)


def accelerator_name(text: str, flag: str) -> str:
    """An accelerator type as the API spells it; a near miss gets 'did you mean'."""
    if text in ACCELERATOR_TYPES:
        return text
    normal = re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_")
    guess = normal if normal in ACCELERATOR_TYPES else None
    if guess is None:
        close = difflib.get_close_matches(normal, ACCELERATOR_TYPES, n=1, cutoff=0.6)
        guess = close[0] if close else None
    if guess is not None:
        raise ConfigError(flag, f"unknown accelerator type; did you mean {guess}?")
    raise ConfigError(flag, f"unknown accelerator type; expected one of {', '.join(ACCELERATOR_TYPES)}")


def check_accelerator(flag: str, machine_type: str, accelerator: tuple[str, int] | None) -> None:
    """Raise ConfigError when the accelerator is impossible on the machine type (where known)."""
    if accelerator is None:
        if machine_type in GPU_MACHINES:
            raise ConfigError(flag, f"{machine_type} always has GPUs attached; leave the accelerator out or match it")
        return
    kind, count = accelerator
    accelerator_name(kind, flag)
    if kind.startswith("TPU_"):
        raise ConfigError(flag, f"{kind}: our images have no TPU runtime (GPU or CPU only)")
    if kind in ARM_ACCELERATORS:
        raise ConfigError(flag, f"{kind} comes on A4X, whose CPUs are Arm (NVIDIA Grace): our images are built for "
                          "x86-64 and cannot run there")
    if kind == "NVIDIA_TESLA_K80":
        raise ConfigError(flag, "NVIDIA_TESLA_K80 has reached end of support on Google Cloud; use T4, L4 or newer")
    if count < 1:
        raise ConfigError(flag, "the accelerator count must be >= 1")
    fixed = GPU_MACHINES.get(machine_type)
    if fixed is not None:
        if (kind, count) != fixed:
            raise ConfigError(flag, f"{machine_type} comes with exactly {fixed[1]} x {fixed[0]}, not {count} x {kind}")
        return
    fam = family(machine_type)
    if fam == "n1":
        allowed = N1_GPUS.get(kind)
        if allowed is None:
            raise ConfigError(flag, f"{kind} does not attach to N1 machines; N1 takes {', '.join(N1_GPUS)}")
        if count not in allowed:
            raise ConfigError(flag, f"{count} x {kind} is not valid on {machine_type}: "
                              f"use {', '.join(map(str, allowed))}")
        _check_n1_size(flag, machine_type, kind, count)
    elif fam in NO_GPU_FAMILIES:
        raise ConfigError(flag, f"{machine_type} takes no GPUs; use an N1, A2, A3, A4 or G2 machine type")


def cuda_refusal(kind: str, cuda_major: int) -> str | None:
    """Why a GPU cannot run an image built on CUDA ``cuda_major`` (None when it can)."""
    capability = COMPUTE_CAPABILITY.get(kind)
    minimum = CUDA_MIN_CAPABILITY[cuda_major]
    if capability is None or capability >= minimum:
        return None
    newer = " (Turing and newer: T4, L4, A100, H100, ...)" if minimum == 7.5 else ""
    return f"{kind} (compute capability {capability}) cannot run CUDA {cuda_major}, which needs {minimum}{newer}"


def n1_memory_gb(machine_type: str) -> float | None:
    """An N1 type's memory: a custom type's from its name, a predefined one's from its class and vCPUs."""
    machine = parse_machine_type(machine_type)
    if machine.memory_mb is not None:
        return machine.memory_mb / 1024
    klass = machine_type.split("-")[1] if machine_type.count("-") == 2 else ""
    if machine.vcpus is None or klass not in N1_GB_PER_VCPU:
        return None
    return machine.vcpus * N1_GB_PER_VCPU[klass]


def _check_n1_size(flag: str, machine_type: str, kind: str, count: int) -> None:
    """N1 with GPUs: at most the vCPUs and memory that GPU model and count allow (1 V100: 12 vCPUs, 78 GB)."""
    limit = N1_GPU_LIMITS.get(kind, {}).get(count)
    cpus, memory = vcpus(machine_type), n1_memory_gb(machine_type)
    if limit is None:
        return
    if cpus is not None and cpus > limit[0]:
        raise ConfigError(flag, f"{count} x {kind} allows at most {limit[0]} vCPUs on N1, and {machine_type} has "
                          f"{cpus}: use fewer vCPUs or more GPUs")
    if memory is not None and memory > limit[1]:
        raise ConfigError(flag, f"{count} x {kind} allows at most {limit[1]} GB of memory on N1, and {machine_type} "
                          f"has {memory:g} GB")


def boot_disk_refusal(machine_type: str, disk_type: str | None) -> str | None:
    """Why a machine cannot boot from ``disk_type`` (None when it can, or when the type is the default)."""
    if disk_type is None:
        return None
    if machine_type.startswith(HYPERDISK_ONLY) and disk_type != HYPERDISK:
        return f"{machine_type} (A3 Ultra / A4) boots from Hyperdisk only: use {HYPERDISK}"
    if family(machine_type) in NO_HYPERDISK_FAMILIES and disk_type.startswith("hyperdisk"):
        return f"{machine_type}: N1 takes no Hyperdisk; use pd-ssd or pd-standard"
    return None


def default_boot_disk(machine_type: str) -> str | None:
    """The boot disk type a machine must be given when none is, else None: Hyperdisk on A4, where DiskSpec's default
    (pd-ssd on every machine but A3 Ultra, whose default is hyperdisk-balanced already) cannot boot it."""
    return HYPERDISK if machine_type.startswith(HYPERDISK_ONLY) and not machine_type.startswith(
        HYPERDISK_DEFAULT) else None


def flex_start_refusal(accelerator: tuple[str, int] | None) -> str | None:
    """Why Dynamic Workload Scheduler cannot provision a pool's GPUs (None when it can)."""
    if accelerator is None:
        return "it provisions GPU machines only (L4, A100, H100, H200, B200)"
    if accelerator[0] not in FLEX_START_GPUS:
        return f"it provisions L4, A100, H100, H200 and B200 GPUs only, not {accelerator[0]}"
    return None
