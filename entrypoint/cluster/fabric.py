"""This node's GPU fabric (GPUDirect-TCPX, GPUDirect-TCPXO, RDMA with gIB): found, its host profile sourced, strays
removed, before any training process starts (docs/fabric.md).

The plugin comes from the host at run time: an init container (GKE) or the host's own install (VMs, Slurm) puts it
in a directory the workload sees, with a profile script that exports the NCCL variables of the plugin's release.
``prepare`` finds the layout (``LAYOUTS``, the paths Google's recipes mount), sources the profile in bash and keeps
exactly what it exports or changes (never copies of Google's values), puts the plugin's directory first on
``LD_LIBRARY_PATH`` as the recipes do, and removes fabric variables that point at a fabric this node lacks. The
user's own values of the variables the profile exports win. ``apply`` writes the result into an environment.

Framework-free and side-effect free until ``apply``: the environment and the detection root are handed in (the root
is ``/`` except in tests, ``TRAINER_FABRIC_ROOT``).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import os
import re
import signal
import subprocess
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from entrypoint.cluster import envvars as ev
from entrypoint.errors import ConfigError

GIB, TCPXO, TCPX = "gib", "tcpxo", "tcpx"
MODES = ("auto", "off", GIB, TCPXO, TCPX)
PROFILE_TIMEOUT = 60.0  # seconds a profile may take (they only export variables)
_MARK = "trainer-fabric-profile-sourced"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What bash itself changes between the two dumps of one shell (not the profile's doing).
_SHELL_OWN = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})
# Dumps the environment, sources the profile, dumps it again; where the second dump cannot start (a profile that
# exports more than a process can be given: E2BIG), says so and the size of each exported variable (bash builtins).
_SCRIPT = ('env -0; printf "%s\\0" "$2"; source "$1" >/dev/null 2>&1 </dev/null; '
           'printf "status=%s\\0" "$?"; env -0 || { LC_ALL=C; printf "%s\\0" "$2-too-large"; '
           'for n in $(compgen -e); do v=${!n}; printf "%s=%s\\0" "$n" "${#v}"; done; }')
_TOO_LARGE = f"{_MARK}-too-large"
ARG_STRLEN = 131072  # bytes one variable (NAME=value and its NUL) may hold in an exec (Linux's MAX_ARG_STRLEN)


@dataclass(frozen=True)
class Layout:
    """One way a fabric's plugin reaches the workload: its directory, profile and the device paths it needs."""

    fabric: str
    machines: str
    source: str  # who puts it there
    plugin_dir: str
    profile: str | None  # TCPX has none: its variables are the job's
    plugin_file: str = "libnccl-net.so"  # what must be in plugin_dir when there is no profile to find it by
    devices: tuple[str, ...] = ()
    # Any one of these (globs) must exist too: an image may carry the gIB packages (GIB=1) on a node without RDMA.
    needs: tuple[str, ...] = ()
    # None of these may exist: on an RDMA node GKE's gIB installer DaemonSet also copies its plugin into the host's
    # nvidia lib64, where TCPX's is looked for.
    excludes: tuple[str, ...] = ()


# Most specific first; the first whose profile (or, without one, plugin file) exists is the node's fabric.
LAYOUTS: tuple[Layout, ...] = (
    Layout(GIB, "A3 Ultra, A4", "gIB installer's volume (GKE) or the nccl-gib packages (VM, Slurm)",
           "/usr/local/gib/lib64", "/usr/local/gib/scripts/set_nccl_env.sh", devices=("/dev/infiniband",),
           needs=("/dev/infiniband", "/sys/class/infiniband/*")),
    Layout(TCPXO, "A3 Mega", "gpu-recipes' nccl-plugin volume (GKE)", "/usr/local/nccl-plugin/lib64",
           "/usr/local/nccl-plugin/lib64/nccl-env-profile.sh", devices=("/dev/aperture_devices",)),
    Layout(TCPXO, "A3 Mega", "the TCPXO installer's workload directory", "/usr/local/tcpxo/lib64",
           "/usr/local/tcpxo/lib64/nccl-env-profile.sh", devices=("/dev/aperture_devices",)),
    Layout(TCPXO, "A3 Mega", "nccl-tcpxo-installer DaemonSet (GKE, the host's nvidia lib64)", "/usr/local/nvidia/lib64",
           "/usr/local/nvidia/lib64/nccl-env-profile.sh", devices=("/dev/aperture_devices",)),
    Layout(TCPXO, "A3 Mega", "the Slurm prolog (VM)", "/var/lib/tcpxo/lib64",
           "/var/lib/tcpxo/lib64/nccl-env-profile.sh", devices=("/dev/aperture_devices", "/dev/dmabuf_import_helper")),
    Layout(TCPX, "A3 High", "nccl-tcpx-installer DaemonSet (GKE, the host's nvidia lib64)", "/usr/local/nvidia/lib64",
           None, excludes=("/dev/infiniband", "/sys/class/infiniband/*")),
)
# Variables that name a file; one that does not exist on this node points at a fabric it does not have.
PATH_VARIABLES = (ev.NCCL_TUNER_CONFIG_PATH, ev.NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE, ev.NCCL_TUNER_PLUGIN,
                  ev.NCCL_NET_PLUGIN)


SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib")


class ProfileError(Exception):
    """The host's profile failed, hung or left no environment behind (the message names the profile)."""


@dataclass(frozen=True)
class FabricStep:
    """What the step found and decided: the variables to set and to remove, and why."""

    mode: str
    layout: Layout | None = None
    set: dict[str, str] = field(default_factory=dict)  # name -> value for the training processes
    removed: dict[str, str] = field(default_factory=dict)  # name -> why (values are never shown)
    kept: tuple[str, ...] = ()  # the user's values the profile would have changed
    problem: str | None = None  # the one line about a bad profile (auto goes on without the fabric)
    host_nccl: str | None = None  # the NCCL core the plugin's directory holds (it comes first: it runs)
    image_nccl: str | None = None  # the image's own NCCL core (the nvidia-nccl wheel torch came with)
    idle: tuple[str, ...] = ()  # plugins here without their fabric's devices (``idle``)

    @property
    def fabric(self) -> str | None:
        return None if self.layout is None or self.problem else self.layout.fabric

    def lines(self) -> list[str]:
        """What the log says (names only, never values)."""
        if self.mode == "off":
            return ["fabric: off (--fabric off): the environment is passed on as it is"]
        out = []
        if self.problem:
            out.append(f"fabric: {self.problem}; going on without the fabric")
        elif self.layout is None:
            out.append("fabric: none found (no GPUDirect-TCPX, -TCPXO or gIB plugin mounted): NCCL's own transports"
                       + "".join(f"; {note}" for note in self.idle))
        else:
            lay, names = self.layout, ", ".join(sorted(self.set)) or "nothing"
            out.append(f"fabric: {lay.fabric} ({lay.machines}) from {lay.source}: plugin {lay.plugin_dir}, profile "
                       f"{lay.profile or 'none (the job sets its variables)'}; set {names}")
            out.append(f"fabric: NCCL core in {lay.plugin_dir}: {self.host_nccl or 'none'} (first on LD_LIBRARY_PATH: "
                       f"it runs where present); the image's: {self.image_nccl or 'none'}")
        if self.kept:
            out.append(f"fabric: kept the user's {', '.join(self.kept)} over the profile's")
        out += [f"fabric: removed {name}: {why}" for name, why in sorted(self.removed.items())]
        return out

    def describe(self) -> dict[str, object]:
        """JSON-ready (``describe``; the caller hides secret values)."""
        lay = self.layout
        return {"mode": self.mode, "found": self.fabric, "machines": lay.machines if lay else None,
                "layout": lay.source if lay else None, "plugin_dir": lay.plugin_dir if lay else None,
                "profile": lay.profile if lay else None, "set": dict(sorted(self.set.items())),
                "removed": dict(sorted(self.removed.items())), "kept_user_values": list(self.kept),
                "problem": self.problem, "idle": list(self.idle),
                "nccl": {"plugin_dir": self.host_nccl, "image": self.image_nccl}}


def mode_of(option: str | None, setting: str | None) -> str:
    """The step's mode: ``--fabric``, else ``TRAINER_FABRIC``, else ``auto`` (a value not in ``MODES`` is a
    ConfigError naming the variable)."""
    if option:
        return option
    if setting and setting not in MODES:
        raise ConfigError(ev.TRAINER_FABRIC, f"must be one of {', '.join(MODES)} (the value set is not one)")
    return setting or "auto"


def under(root: str, path: str) -> str:
    """``path`` as this process sees it when the node's tree is mounted at ``root`` (``/`` outside tests)."""
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def detect(root: str = "/", wanted: str | None = None, lib_dir: str | None = None) -> Layout | None:
    """The first layout present under ``root`` (of fabric ``wanted`` when given). ``lib_dir`` (the user's
    ``NCCL_LIB_DIR``) is looked at first for TCPXO's profile."""
    layouts = list(LAYOUTS)
    if lib_dir:
        layouts.insert(1, Layout(TCPXO, "A3 Mega", f"{ev.NCCL_LIB_DIR} (the user's)", lib_dir,
                                 f"{lib_dir.rstrip('/')}/nccl-env-profile.sh", devices=("/dev/aperture_devices",)))
    for lay in layouts:
        if wanted not in (None, lay.fabric):
            continue
        if _present(lay, root) and _needs_met(lay, root):
            return lay
    return None


def _present(lay: Layout, root: str) -> bool:
    return os.path.isfile(under(root, lay.profile if lay.profile else f"{lay.plugin_dir}/{lay.plugin_file}"))


def _needs_met(lay: Layout, root: str) -> bool:
    return ((not lay.needs or any(glob.glob(under(root, pattern)) for pattern in lay.needs))
            and not any(glob.glob(under(root, pattern)) for pattern in lay.excludes))


def idle(root: str = "/") -> list[str]:
    """Plugins here on a node without their fabric's devices (an image carrying gIB on a node without RDMA NICs)."""
    return [f"the {lay.fabric} plugin ({lay.profile}) is here, but none of {', '.join(lay.needs)}: not used"
            for lay in LAYOUTS if lay.needs and _present(lay, root) and not _needs_met(lay, root)]


def prepare(mode: str, environ: Mapping[str, str], root: str = "/", timeout: float = PROFILE_TIMEOUT) -> FabricStep:
    """The fabric step for ``environ`` (the node's environment): ``mode`` is ``auto``, ``off`` or a fabric that
    must be there (a ConfigError when it is not, or its profile is bad)."""
    if mode not in MODES:
        raise ConfigError("--fabric", f"must be one of {', '.join(MODES)}")
    if mode == "off":
        return FabricStep(mode)
    layout = detect(root, None if mode == "auto" else mode, environ.get(ev.NCCL_LIB_DIR) or None)
    if layout is None and mode != "auto":
        raise ConfigError("--fabric", f"{mode} asked for, but this node has no {mode} plugin: looked for "
                          + ", ".join(lay.profile or f"{lay.plugin_dir}/{lay.plugin_file}"
                                      for lay in LAYOUTS if lay.fabric == mode)
                          + "".join(f"; {note}" for note in idle(root)))
    exported: dict[str, str] = {}
    problem = None
    if layout is not None and layout.profile:
        try:
            exported = source_profile(layout, environ, root, timeout)
        except ProfileError as exc:
            if mode != "auto":
                raise ConfigError("--fabric", str(exc)) from exc
            problem = str(exc)
    chosen, kept = _user_wins(exported, environ)
    if layout is not None and problem is None:
        chosen[ev.LD_LIBRARY_PATH] = _first_on_path(layout.plugin_dir, chosen.get(ev.LD_LIBRARY_PATH,
                                                                                  environ.get(ev.LD_LIBRARY_PATH, "")))
        if layout.fabric == TCPXO and not environ.get(ev.NCCL_LIB_DIR):
            chosen[ev.NCCL_LIB_DIR] = layout.plugin_dir  # what the profile was sourced with, as the recipes set it
    fabric = None if layout is None or problem else layout.fabric
    # Only inherited values are strays (the profile's own are passed as exported); a stray user value the
    # profile would have replaced gives way to the profile's.
    removed = {n: why for n, why in strays(fabric, {**environ, **chosen}, root).items() if n not in chosen}
    chosen.update({n: exported[n] for n in removed if n in exported})
    kept = tuple(n for n in kept if n not in removed)
    host = nccl_in(under(root, layout.plugin_dir)) if layout is not None and problem is None else None
    return FabricStep(mode, layout, chosen, removed, kept, problem, host, image_nccl(),
                      tuple(idle(root)) if layout is None else ())


def nccl_in(directory: str) -> str | None:
    """The version of the NCCL core in ``directory`` (``libnccl.so.2.21.5``, or what ``libnccl.so.2`` links to)."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(directory, "libnccl.so.2*"))]
    if os.path.islink(os.path.join(directory, "libnccl.so.2")):
        names.append(os.path.basename(os.readlink(os.path.join(directory, "libnccl.so.2"))))
    versions = sorted({n[len("libnccl.so."):] for n in names if n.count(".") >= 4})
    return versions[-1] if versions else ("present" if names else None)


def image_nccl() -> str | None:
    """The image's NCCL wheel's version (``nvidia-nccl-cu12`` / ``-cu13``), read without importing a framework."""
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return f"{importlib.metadata.version(name)} ({name})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def source_profile(layout: Layout, environ: Mapping[str, str], root: str, timeout: float) -> dict[str, str]:
    """The variables ``layout``'s profile exports or changes, sourced by bash in ``environ`` (its output discarded:
    none of it reaches a log). A profile that fails, exits, or outlives ``timeout`` is a ProfileError."""
    assert layout.profile is not None
    path = under(root, layout.profile)
    env = dict(environ)
    if layout.fabric == TCPXO:
        env.setdefault(ev.NCCL_LIB_DIR, layout.plugin_dir)  # the profile reads it (the TCPXO release notes)
    try:
        proc = subprocess.Popen(["bash", "-c", _SCRIPT, "trainer-fabric", path, _MARK], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        raise ProfileError(f"profile {layout.profile}: bash could not start ({exc.strerror})") from None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the profile's own children too
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # not read again: a child that left the group may still hold the pipe
        raise ProfileError(f"profile {layout.profile} did not finish within {timeout:g} s") from None
    entries = out.decode("utf-8", "surrogateescape").split("\0")
    if _MARK not in entries:
        raise ProfileError(f"profile {layout.profile}: bash could not run it (exit {proc.returncode})")
    at = entries.index(_MARK)
    status = entries[at + 1] if len(entries) > at + 1 else ""
    if not status.startswith("status="):
        raise ProfileError(f"profile {layout.profile} ended the shell that sourced it (exit {proc.returncode})")
    if status != "status=0":
        raise ProfileError(f"profile {layout.profile} failed ({status.replace('=', ' ', 1)})")
    if _TOO_LARGE in entries:
        raise ProfileError(_too_large(layout, _variables(entries[entries.index(_TOO_LARGE) + 1:])))
    before, after = _variables(entries[:at]), _variables(entries[at + 2:])
    return {name: value for name, value in after.items() if before.get(name) != value and name not in _SHELL_OWN}


def _too_large(layout: Layout, sizes: dict[str, str]) -> str:
    """What a profile exports that no process could be started with: its largest variable, or all of them."""
    lengths = {name: len(name) + 2 + int(size) for name, size in sizes.items() if size.isdigit()}
    name, largest = max(lengths.items(), key=lambda item: item[1], default=("", 0))
    if largest > ARG_STRLEN:
        why = f"{name} is {largest} bytes, a variable holds at most {ARG_STRLEN}"
    else:
        why = f"its variables come to {sum(lengths.values())} bytes together, past this system's limit"
    return f"profile {layout.profile} exports more than a process can be started with ({why})"


def _variables(entries: list[str]) -> dict[str, str]:
    found = {}
    for entry in entries:
        name, eq, value = entry.partition("=")
        if eq and _NAME.fullmatch(name):
            found[name] = value
    return found


def _user_wins(exported: dict[str, str], environ: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The profile's variables less those the user set (``LD_LIBRARY_PATH`` is a list the profile may extend)."""
    kept = tuple(sorted(n for n in exported if n in environ and n != ev.LD_LIBRARY_PATH))
    return {n: v for n, v in exported.items() if n not in kept}, kept


def _first_on_path(directory: str, path: str) -> str:
    parts = [p for p in path.split(":") if p and p != directory]
    return ":".join([directory, *parts])


def strays(fabric: str | None, environ: Mapping[str, str], root: str = "/") -> dict[str, str]:
    """Fabric variables in ``environ`` that point at a fabric this node does not have: name -> why."""
    found = {}
    net = environ.get(ev.NCCL_NET, "")
    if net.strip().lower() == GIB and fabric != GIB:
        found[ev.NCCL_NET] = "names the gIB plugin, and this node has no gIB fabric"
    dirs = [d for d in environ.get(ev.LD_LIBRARY_PATH, "").split(":") if d] + list(SYSTEM_LIB_DIRS)
    for name in PATH_VARIABLES:
        value = environ.get(name, "").strip()
        if not value:
            continue
        if "/" in value:
            if not os.path.exists(under(root, value)):
                found[name] = "names a file this node does not have"
        elif name == ev.NCCL_TUNER_PLUGIN and not any(os.path.exists(under(root, f"{d}/{value}")) for d in dirs):
            found[name] = "names a library on no directory of LD_LIBRARY_PATH"
    return found


def apply(step: FabricStep, environ: MutableMapping[str, str]) -> bool:
    """Write the step into ``environ`` (the environment the training processes inherit); whether it changed the
    library path (which the dynamic loader of a running process read at its start)."""
    library_path = environ.get(ev.LD_LIBRARY_PATH, "")
    for name in step.removed:
        environ.pop(name, None)
    environ.update(step.set)
    return environ.get(ev.LD_LIBRARY_PATH, "") != library_path
