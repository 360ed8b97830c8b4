"""``doctor``'s checks of the GPU fabric (docs/fabric.md): the step's verdict, the plugin present and loadable,
libibverbs for gIB, the devices TCPX / TCPXO need, glibc >= 2.35 and the guest config checker's variables for TCPXO.

``facts`` reads the node (the fabric step, files, a plugin loaded in a child process); ``findings`` decides (no I/O).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from entrypoint.cluster import envvars as ev
from entrypoint.cluster import fabric
from entrypoint.doctor.checks import Finding
from entrypoint.errors import ConfigError

MIN_TCPXO_GLIBC = (2, 35)  # the TCPXO plugin's requirement (Google's GPUDirect-TCPXO pages)
# What TCPXO's guest config checker aborts a workload without (its profile exports them; a hand copy may not).
TCPXO_REQUIRED = (ev.NCCL_NVLSTREE_MAX_CHUNKSIZE,)
FIX_VOLUME = "mount the plugin installer's volume where Google's recipes mount it (docs/fabric.md)"
LOAD_TIMEOUT = 60.0
DEVICE_FIX = {
    fabric.GIB: "the pod needs the RDMA NICs: networking.gke.io/interfaces with the rdma-0..7 networks",
    fabric.TCPXO: "mount hostPath /dev/aperture_devices into the workload, and run the RxDM sidecar (tcpxo-daemon) "
                  "with /dev/dmabuf_import_helper, as the recipes do",
    fabric.TCPX: "mount RxDM's socket directory (hostPath /run/tcpx) where the job's "
                 "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX names it, and run the tcpx-daemon sidecar",
}


@dataclass(frozen=True)
class FabricFacts:
    step: fabric.FabricStep | None
    error: str | None = None  # the step's ConfigError (an explicit --fabric that is not there)
    plugins: tuple[str, ...] = ()  # the plugin files in the plugin dir
    load_error: str | None = None  # why the first plugin did not load here (None: it loaded, or not tried)
    loaded: bool = False
    ibverbs: bool = False
    present: dict[str, bool] = field(default_factory=dict)  # device or socket path -> exists
    glibc: tuple[int, ...] | None = None
    env: dict[str, str] = field(default_factory=dict)  # the environment the training processes would get


def facts(mode: str, environ: Mapping[str, str], root: str, load: bool) -> FabricFacts:
    """Run the fabric step as ``run`` would (without applying it) and read what its fabric needs."""
    try:
        step = fabric.prepare(mode, environ, root)
    except ConfigError as exc:
        return FabricFacts(None, error=str(exc))
    env = {k: v for k, v in {**environ, **step.set}.items() if k not in step.removed}
    lay = step.layout
    if lay is None or step.problem:
        return FabricFacts(step, env=env)
    plugins = tuple(sorted(glob.glob(os.path.join(fabric.under(root, lay.plugin_dir), "libnccl-net*.so*"))))
    loaded, load_error = False, None
    if load and plugins:
        loaded, load_error = _load(plugins[0], env)
    paths = list(lay.devices)
    if lay.fabric == fabric.TCPX and env.get(ev.NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX):
        paths.append(env[ev.NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX])
    return FabricFacts(step, plugins=plugins, loaded=loaded, load_error=load_error,
                       ibverbs=_has_library("libibverbs.so.1", env, root),
                       present={p: os.path.exists(fabric.under(root, p)) for p in paths}, glibc=_glibc(), env=env)


def _load(path: str, env: dict[str, str]) -> tuple[bool, str | None]:
    """Whether ``path`` loads (``ctypes.CDLL`` in a child process, with the environment training would have)."""
    code = "import ctypes, sys\ntry:\n    ctypes.CDLL(sys.argv[1])\nexcept OSError as e:\n    sys.exit(str(e))"
    try:
        done = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True,
                              timeout=LOAD_TIMEOUT)
    except subprocess.TimeoutExpired:
        return False, f"loading it took over {LOAD_TIMEOUT:g} s"
    reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return done.returncode == 0, None if done.returncode == 0 else reason


def _has_library(name: str, env: Mapping[str, str], root: str) -> bool:
    dirs = [d for d in env.get(ev.LD_LIBRARY_PATH, "").split(":") if d] + list(fabric.SYSTEM_LIB_DIRS)
    return any(os.path.exists(fabric.under(root, os.path.join(d, name))) for d in dirs)


def _glibc() -> tuple[int, ...] | None:
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    numbers = found.rpartition(" ")[2].split(".")
    return tuple(int(n) for n in numbers if n.isdigit()) or None


def findings(found: FabricFacts) -> list[Finding]:
    """One finding a check: the fabric, then (where one was found) its plugin and what its kind needs."""
    if found.step is None:
        return [Finding("fabric", "error", found.error or "the fabric asked for is not here",
                        "--fabric auto (or off), or run on a node of that machine type")]
    step, lay = found.step, found.step.layout
    if step.mode == "off":
        return [Finding("fabric", "skipped", "--fabric off: the environment is passed on as it is")]
    removed = f"; removes {', '.join(sorted(step.removed))}" if step.removed else ""
    if step.problem:
        return [Finding("fabric", "warning", f"{step.problem}: the run goes on without the fabric{removed}",
                        "fix or replace the host's profile (the plugin installer's version), or --fabric off")]
    if lay is None:
        return [Finding("fabric", "ok" if not removed else "warning", f"none found: NCCL's own transports; "
                        f"{nccl_words(step)}{removed}" + "".join(f"; {note}" for note in step.idle),
                        None if not removed else "drop these variables from the image or the job")]
    out = [Finding("fabric", "warning" if removed else "ok", f"{lay.fabric} ({lay.machines}) from {lay.source}; "
                   f"profile {lay.profile or 'none'}; sets {len(step.set)} variables; {nccl_words(step)}{removed}",
                   "drop these variables from the image or the job" if removed else None)]
    out.append(_plugin(found, lay))
    out += _needs(found, lay)
    return out


def nccl_words(step: fabric.FabricStep) -> str:
    """The NCCL core training loads: the plugin directory's (first on the library path), else the image's wheel."""
    if step.host_nccl and step.layout is not None:
        return f"NCCL {step.host_nccl} from {step.layout.plugin_dir} (the image's: {step.image_nccl or 'none'})"
    return f"NCCL {step.image_nccl}" if step.image_nccl else "no NCCL wheel in this image"


def _plugin(found: FabricFacts, lay: fabric.Layout) -> Finding:
    if not found.plugins:
        return Finding("fabric plugin", "error", f"no libnccl-net*.so in {lay.plugin_dir}: NCCL falls back to "
                       "TCP or fails", FIX_VOLUME)
    name = os.path.basename(found.plugins[0])
    if found.load_error:
        return Finding("fabric plugin", "warning", f"{lay.plugin_dir}/{name} did not load here: {found.load_error}",
                       "it needs the GPU driver's libraries (/usr/local/nvidia/lib64); on a GPU node, reinstall "
                       "the plugin with its installer")
    return Finding("fabric plugin", "ok", f"{lay.plugin_dir}/{name}" + (" loads" if found.loaded else " present"))


def _needs(found: FabricFacts, lay: fabric.Layout) -> list[Finding]:
    out = []
    missing = [p for p, there in found.present.items() if not there]
    if lay.fabric == fabric.GIB:
        out.append(Finding("libibverbs", "ok", "libibverbs.so.1 found") if found.ibverbs else Finding(
            "libibverbs", "error", "libibverbs.so.1 is on no library path: gIB fails with \"Failed to initialize "
            "any NET plugin\"", "install libibverbs1 (rdma-core) in the image: build it with GIB=1"))
    if lay.fabric in (fabric.GIB, fabric.TCPXO, fabric.TCPX) and found.present:
        fix = DEVICE_FIX[lay.fabric]
        out.append(Finding("fabric devices", "error" if missing and lay.fabric != fabric.TCPX else
                           "warning" if missing else "ok",
                           f"missing {', '.join(missing)}" if missing else f"{', '.join(found.present)} present",
                           fix if missing else None))
    if lay.fabric == fabric.TCPXO:
        glibc = ".".join(map(str, found.glibc)) if found.glibc else "unknown"
        if found.glibc is not None and found.glibc < MIN_TCPXO_GLIBC:
            out.append(Finding("glibc", "error", f"glibc {glibc}: the TCPXO plugin needs >= 2.35",
                               "a base image with glibc >= 2.35 (Ubuntu 22.04 or later)"))
        else:
            out.append(Finding("glibc", "ok", f"glibc {glibc} (TCPXO needs >= 2.35)"))
        absent = [name for name in TCPXO_REQUIRED if not found.env.get(name)]
        out.append(Finding("fabric variables", "error", f"{', '.join(absent)} unset: TCPXO's guest config checker "
                           "aborts the workload", "source the host's nccl-env-profile.sh (--fabric auto does) "
                           "instead of copying its values") if absent else
                   Finding("fabric variables", "ok", f"{', '.join(TCPXO_REQUIRED)} set"))
    return out
