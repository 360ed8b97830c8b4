"""The local CUDA devel base of the GPU builds (make image-test-gpu): localhost/cuda-devel:13.0-bookworm.

The release builds compile Horovod's NCCL operations on nvidia/cuda:13.0.3-cudnn-devel-ubuntu24.04 (nvcc, the CUDA
headers and NCCL's headers from NVIDIA's apt repository). No registry and no NVIDIA repository can be reached
here, only PyPI and Debian, so this base is made from the local Debian base and NVIDIA's own PyPI wheels of the same
CUDA release: the toolkit parts the compile needs, at cuda-toolkit 13.0.3's pins (nvcc, its crt headers, nvvm, CCCL),
and the runtime (headers, libcudart), NCCL and NVTX at the Horovod GPU lock's pins, so the NCCL headers are exactly
those of the libnccl.so.2 the image's torch loads. They are laid out as the CUDA toolkit is
(/usr/local/cuda -> cuda-13.0, targets/x86_64-linux/{include,lib}), and NCCL's headers and library are packaged as
`libnccl-dev` in a local apt repository (file:/opt/local-apt), so the Horovod Dockerfile's
`apt-get install libnccl-dev` runs unchanged. Only the builder stage uses this base: the runtime stage is the plain
local Debian base plus the venv, whose nvidia-* wheels carry the CUDA runtime (as on PyPI, no CUDA base needed).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from build_common import ROOT, Failure, log
from container_engine import Engine
from debian_base import BASE_REF

CUDA_DEVEL_REF = "localhost/cuda-devel:13.0-bookworm"
CUDA_VERSION = "13.0"
# cuda-toolkit 13.0.3's pins of the parts a compile needs (its wheel's metadata: extras nvcc, crt, nvvm, cccl).
TOOLKIT_PINS = ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-crt==13.0.88", "nvidia-nvvm==13.0.88",
                "nvidia-cuda-cccl==13.0.85")
# Taken at the Horovod GPU lock's versions: what the image's torch runs with.
FROM_LOCK = ("nvidia-cuda-runtime", "nvidia-nccl-cu13", "nvidia-nvtx")
RECIPE_LABEL = "org.trainer-images.cuda-devel"  # hash of the pins and the recipe below: remade when either changes

DOCKERFILE = """\
FROM {base}
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
# The wheels are mounted at /wheels for this step only (podman build --volume), so no layer keeps them.
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends unzip \\
    && mkdir -p /tmp/x && for w in /wheels/*.whl; do unzip -q -o "$w" -d /tmp/x; done \\
    && cuda=/usr/local/cuda-{cuda} && target=$cuda/targets/x86_64-linux \\
    && mkdir -p "$target" && cp -a /tmp/x/nvidia/cu13/include /tmp/x/nvidia/cu13/lib "$target"/ \\
    && cp -a /tmp/x/nvidia/cu13/bin /tmp/x/nvidia/cu13/nvvm "$cuda"/ \\
    && ln -s targets/x86_64-linux/include "$cuda"/include && ln -s targets/x86_64-linux/lib "$cuda"/lib64 \\
    && ln -s "cuda-{cuda}" /usr/local/cuda \\
    && for so in "$target"/lib/*.so.*; do ln -sf "$(basename "$so")" "${{so%.so.*}}.so"; done \\
    && deb=/tmp/deb && libdir=$deb/usr/lib/x86_64-linux-gnu && mkdir -p "$deb/DEBIAN" "$deb/usr/include" "$libdir" \\
    && cp -a /tmp/x/nvidia/nccl/include/. "$deb/usr/include/" && cp -a /tmp/x/nvidia/nccl/lib/libnccl.so.2 "$libdir/" \\
    && ln -s libnccl.so.2 "$libdir/libnccl.so" \\
    && printf '%s\\n' 'Package: libnccl-dev' 'Version: {nccl}-1+pypi' 'Architecture: amd64' \\
        'Maintainer: trainer-images local build' 'Section: libdevel' 'Priority: optional' \\
        'Description: NCCL {nccl} headers and library from the nvidia-nccl-cu13 wheel (local GPU builds)' \\
        > "$deb/DEBIAN/control" \\
    && mkdir -p /opt/local-apt && dpkg-deb --build "$deb" /opt/local-apt/libnccl-dev.deb >/dev/null \\
    && cd /opt/local-apt && size=$(stat -c %s libnccl-dev.deb) && sha=$(sha256sum libnccl-dev.deb | cut -d' ' -f1) \\
    && {{ cat "$deb/DEBIAN/control"; \\
          printf 'Filename: ./libnccl-dev.deb\\nSize: %s\\nSHA256: %s\\n\\n' "$size" "$sha"; }} > Packages \\
    && echo 'deb [trusted=yes] file:/opt/local-apt ./' > /etc/apt/sources.list.d/local-cuda.list \\
    && apt-get purge -y --auto-remove unzip && rm -rf /var/lib/apt/lists/* /tmp/x "$deb" \\
    && /usr/local/cuda/bin/nvcc --version
ENV PATH=/usr/local/cuda/bin:$PATH
LABEL {label}={recipe}
"""


def lock_pins() -> list[str]:
    """FROM_LOCK's exact pins in images/horovod/requirements.txt (the GPU lock)."""
    pins = {}
    for line in (ROOT / "images" / "horovod" / "requirements.txt").read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name.lower() in FROM_LOCK:
            pins[name.lower()] = f"{name}=={version}"
    missing = sorted(set(FROM_LOCK) - set(pins))
    if missing:
        raise Failure(f"images/horovod/requirements.txt pins no {', '.join(missing)}: "
                      "the local CUDA devel base needs them")
    return [pins[name] for name in FROM_LOCK]


def recipe() -> tuple[list[str], str, str]:
    """(the wheels' pins, the Dockerfile, its hash)."""
    pins = [*TOOLKIT_PINS, *lock_pins()]
    nccl = next(p.partition("==")[2] for p in pins if p.startswith("nvidia-nccl-cu13=="))
    text = DOCKERFILE.format(base=BASE_REF, cuda=CUDA_VERSION, nccl=nccl, label=RECIPE_LABEL, recipe="{recipe}")
    digest = hashlib.sha256("\n".join([*pins, text]).encode()).hexdigest()[:12]
    return pins, text.replace("{recipe}", digest), digest


def ensure_cuda_devel(engine: Engine) -> None:
    """Make localhost/cuda-devel:13.0-bookworm unless one of this recipe exists (the base must exist)."""
    pins, dockerfile, digest = recipe()
    if engine.exists(CUDA_DEVEL_REF):
        label = engine.output("image", "inspect", "--format", f'{{{{index .Config.Labels "{RECIPE_LABEL}"}}}}',
                              CUDA_DEVEL_REF).strip()
        if label == digest:
            log(f"CUDA devel base {CUDA_DEVEL_REF} is current ({digest})")
            return
    log(f"making the CUDA devel base {CUDA_DEVEL_REF} from PyPI's CUDA {CUDA_VERSION} wheels: {', '.join(pins)}")
    with tempfile.TemporaryDirectory(prefix="trainer-cuda-") as tmp:
        wheels = Path(tmp) / "wheels"
        download = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                    "--only-binary=:all:", "--dest", str(wheels), *pins]
        if subprocess.run(download, check=False).returncode != 0:
            raise Failure(f"`pip download` of the CUDA wheels failed (is PyPI reachable?): {' '.join(pins)}")
        (Path(tmp) / "Dockerfile").write_text(dockerfile)
        command = engine.command("build", *engine.build_flags(), "--volume", f"{wheels}:/wheels:ro",
                                 f"--tag={CUDA_DEVEL_REF}", tmp)
        if subprocess.run(command, check=False).returncode != 0:
            raise Failure(f"making {CUDA_DEVEL_REF} failed at the step shown above")
    log(f"CUDA devel base {CUDA_DEVEL_REF} made ({digest})")
