#!/usr/bin/env bash
# Build a Horovod wheel against the torch installed in a given Python (venv), with a
# local wheel cache.  Used by CI/Makefile on the build machine and by the Horovod
# Dockerfile's builder stage.
#
#   usage: build_horovod_wheel.sh PYTHON OUTDIR
#     PYTHON  interpreter of a venv that already has torch (+ numpy, ...) installed
#             from the image lock (images/horovod/requirements-*.txt)
#     OUTDIR  directory that receives horovod-$HOROVOD_VERSION-*.whl
#
#   env knobs (defaults):
#     HOROVOD_VERSION            0.28.1
#     HOROVOD_SDIST_SHA256       known hash for 0.28.1; empty = do not check
#     HOROVOD_GPU_OPERATIONS     unset on CPU (gloo); NCCL in the GPU image
#     HOROVOD_WITH_TENSORFLOW    unset = build without TensorFlow; 1 = with
#     TRAINER_WHEEL_CACHE        ${XDG_CACHE_HOME:-$HOME/.cache}/trainer-images/wheels
#     HOROVOD_BUILD_PARALLELISM  number of make jobs (default: nproc)
#     MAKEFLAGS                  if it sets the parallelism (-jN, or a make jobserver), used as is
#                                (overrides HOROVOD_BUILD_PARALLELISM); otherwise -jN is added to it
#     HOROVOD_FORCE_REBUILD      1 = ignore a cached wheel and rebuild (then refresh it)
#     HOROVOD_BUILD_VERBOSE      1 = show the full CMake/compiler output
#     HOROVOD_WHEEL_URL          base URL of a wheel cache laid out like TRAINER_WHEEL_CACHE
#                                (<key>/key.txt + <key>/horovod-*.whl, e.g. served over HTTP by
#                                images/local_build.py): a wheel whose key.txt equals this build's key
#                                material is taken from there instead of compiling; anything else
#                                (no such key, unreachable, a bad wheel) falls back to the source build
#     HOROVOD_KEY_ONLY           1 = print this build's cache key and key material, then exit
#
# Why a source build: horovod 0.28.1 (the last release) sets CMAKE_CXX_STANDARD 14, but
# torch >= 2.1 headers need C++17.  Upstream fixed this in PR #3998, never released.
# The only patches applied here: 14 -> 17 in CMakeLists.txt and horovod/torch/CMakeLists.txt, and a Release
# build type (no debug info);
# with TensorFlow, three more (TF >= 2.18 headers; tf.keras's backend and momentum correction for the
# horovod.tensorflow.keras callbacks).
set -euo pipefail

die() { echo "build_horovod_wheel.sh: ERROR: $*" >&2; exit 1; }
log() { echo "build_horovod_wheel.sh: $*" >&2; }

[[ $# -eq 2 ]] || die "usage: $0 PYTHON OUTDIR"
PY=$1
OUTDIR=$2
[[ -x $PY ]] || PY=$(command -v "$PY" 2>/dev/null) || die "python '$1' not found"

HOROVOD_VERSION=${HOROVOD_VERSION:-0.28.1}
if [[ -z ${HOROVOD_SDIST_SHA256+x} ]]; then
    # sha256 of horovod-0.28.1.tar.gz as served by PyPI
    [[ $HOROVOD_VERSION == 0.28.1 ]] \
        && HOROVOD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0 \
        || HOROVOD_SDIST_SHA256=
fi
CACHE_ROOT=${TRAINER_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainer-images/wheels}

# Build-time Python deps: with --no-build-isolation setup.py imports `packaging` and
# passes `setup_requires` (cloudpickle psutil pyyaml packaging cffi) which setuptools would
# otherwise fetch on its own, unpinned.  setuptools >= 70.1 builds wheels without the
# `wheel` package.  The image lock (requirements-*.txt next to this script) lists these
# same pins; any that are missing are installed here with exactly these versions.
BUILD_DEPS=(
    setuptools==84.2.1
    packaging==26.3
    cloudpickle==3.1.2
    psutil==7.2.2
    PyYAML==6.0.3
    cffi==2.1.1
    pycparser==3.12
)

# ---- build flags (these, and only these, define the build variant) -------------------
unset HOROVOD_WITHOUT_TENSORFLOW HOROVOD_WITH_MXNET HOROVOD_WITH_MPI HOROVOD_WITHOUT_GLOO \
      HOROVOD_WITHOUT_PYTORCH HOROVOD_SKIP_COMPILE HOROVOD_LOCAL_VERSION
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
if [[ -n ${HOROVOD_WITH_TENSORFLOW:-} ]]; then
    export HOROVOD_WITH_TENSORFLOW=1
else
    unset HOROVOD_WITH_TENSORFLOW
    export HOROVOD_WITHOUT_TENSORFLOW=1
fi
[[ -n ${HOROVOD_GPU_OPERATIONS:-} ]] && export HOROVOD_GPU_OPERATIONS || unset HOROVOD_GPU_OPERATIONS
# Run from make, MAKEFLAGS is make's own: empty, or just " -- VAR=value" for `make VAR=value ...`, which
# would build on one core.
if [[ ! ${MAKEFLAGS:-} =~ (^|[[:space:]])-j|jobserver ]]; then
    export MAKEFLAGS="-j${HOROVOD_BUILD_PARALLELISM:-$(nproc 2>/dev/null || echo 2)} ${MAKEFLAGS:-}"
fi

# ---- cache key ---------------------------------------------------------------------------
# horovod version + patch revision + torch version + python tag + arch + op/framework flags
# (+ the TensorFlow version when built with it).
read -r TORCH_VERSION PYTAG TF_VERSION < <("$PY" - <<'EOF'
import sys, os
import torch
tf = "none"
if os.environ.get("HOROVOD_WITH_TENSORFLOW"):
    import tensorflow
    tf = tensorflow.__version__
print(torch.__version__, "cp%d%d" % sys.version_info[:2], tf)
EOF
) || die "cannot import torch with $PY (install the image lock into that venv first)"
[[ -n ${TORCH_VERSION:-} ]] || die "could not read the torch version from $PY"
PATCH_REV="cxx17-v1+release-v1"
[[ $TF_VERSION == none ]] || PATCH_REV="$PATCH_REV+tfxla-v2+tfkeras-v1+tfgloo-v1"
FLAGS=$(env | grep -E '^HOROVOD_(WITH|WITHOUT|GPU|CPU_OPERATIONS|CUDA_HOME|NCCL_|ROCM|DEBUG|BUILD_CUDA_CC_LIST|BUILD_ARCH_FLAGS)' \
        | grep -vE '^HOROVOD_(WITH_TENSORFLOW|WITHOUT_TENSORFLOW)=' | LC_ALL=C sort | paste -sd' ' || true)
KEY_MATERIAL="horovod=$HOROVOD_VERSION patch=$PATCH_REV torch=$TORCH_VERSION python=$PYTAG arch=$(uname -m) tensorflow=$TF_VERSION $FLAGS"
KEY_HASH=$(printf '%s' "$KEY_MATERIAL" | sha256sum | cut -c1-12)
KEY="horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$PYTAG-$KEY_HASH"
CACHE_DIR="$CACHE_ROOT/$KEY"
if [[ ${HOROVOD_KEY_ONLY:-0} == 1 ]]; then
    printf '%s\n%s\n' "$KEY" "$KEY_MATERIAL"
    exit 0
fi

mkdir -p "$OUTDIR"

copy_out() {  # atomic copy of wheel $1 into OUTDIR
    local src=$1 dst
    dst="$OUTDIR/$(basename "$src")"
    cp "$src" "$dst.partial.$$"
    mv -f "$dst.partial.$$" "$dst"
    echo "$dst"
}

find_cached() {
    compgen -G "$CACHE_DIR/horovod-$HOROVOD_VERSION-*.whl" | head -n1 || true
}

if [[ ${HOROVOD_FORCE_REBUILD:-0} != 1 ]]; then
    cached=$(find_cached)
    if [[ -n $cached ]] && "$PY" -c 'import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)' "$cached"; then
        out=$(copy_out "$cached")
        echo "horovod wheel: cache HIT ($KEY) -> $out"
        exit 0
    fi
    [[ -n $cached ]] && log "cached wheel $cached is unreadable, rebuilding"
fi
log "cache miss: $KEY"
log "key: $KEY_MATERIAL"

# ---- a wheel served for exactly this key (HOROVOD_WHEEL_URL) -----------------------------------
check_wheel() {  # the extensions must really be in there (a wheel without them builds "fine" if cmake skipped one)
    "$PY" - "$1" "${HOROVOD_WITH_TENSORFLOW:-}" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["horovod/torch/mpi_lib_v2"] + (["horovod/tensorflow/mpi_lib"] if sys.argv[2] else [])
missing = [p for p in need if not any(n.startswith(p) and n.endswith(".so") for n in names)]
if missing:
    sys.exit(f"wheel lacks {', '.join(missing)}*.so")
EOF
}

if [[ -n ${HOROVOD_WHEEL_URL:-} ]]; then
    FETCHED=$(mktemp -d "${TMPDIR:-/tmp}/horovod-served.XXXXXX")
    # Prints the wheel's path, or why not (stderr) and nothing.
    served=$("$PY" - "${HOROVOD_WHEEL_URL%/}/$KEY" "$KEY_MATERIAL" "$HOROVOD_VERSION" "$FETCHED" <<'EOF'
import re, sys, urllib.request, zipfile
base, material, version, folder = sys.argv[1:]
def get(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()
try:
    served_key = get(f"{base}/key.txt").decode().strip()
    if served_key != material.strip():
        sys.exit(f"served key differs: {served_key!r}")
    names = sorted(set(re.findall(rf'href="(horovod-{re.escape(version)}-[^"/]+\.whl)"', get(f"{base}/").decode())))
    if len(names) != 1:
        sys.exit(f"expected one horovod-{version} wheel at {base}/, found {len(names)}")
    path = f"{folder}/{names[0]}"
    with open(path, "wb") as out:
        out.write(get(f"{base}/{names[0]}"))
    if zipfile.ZipFile(path).testzip() is not None:
        sys.exit(f"{names[0]} is corrupt")
except Exception as exc:  # whatever went wrong, the caller compiles instead
    sys.exit(f"{base}: {type(exc).__name__}: {exc}")
print(path)
EOF
    ) || true
    if [[ -n $served ]] && check_wheel "$served"; then
        out=$(copy_out "$served")
        rm -rf "$FETCHED"
        echo "horovod wheel: served for this key ($KEY) by $HOROVOD_WHEEL_URL -> $out"
        exit 0
    fi
    rm -rf "$FETCHED"
    log "no usable wheel for this key at $HOROVOD_WHEEL_URL (see above): building from source"
fi

# ---- build ---------------------------------------------------------------------------------
command -v cmake >/dev/null || die "cmake not found (need >= 3.13)"
command -v c++ >/dev/null || die "no C++ compiler (c++) found"

START=$(date +%s)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

missing=$("$PY" - "${BUILD_DEPS[@]}" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
for req in sys.argv[1:]:
    name, want = req.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        print(req)
        continue
    if have != want:
        print(f"note: {name} {have} installed (script pin {want}); keeping the venv's version", file=sys.stderr)
EOF
)
if [[ -n $missing ]]; then
    log "installing missing build deps: $(echo $missing)"
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-cache-dir --disable-pip-version-check $missing
fi

log "downloading horovod==$HOROVOD_VERSION sdist"
"$PY" -m pip download --disable-pip-version-check --no-binary :all: --no-deps \
    --no-build-isolation -d "$WORK/dl" "horovod==$HOROVOD_VERSION"
SDIST=$(compgen -G "$WORK/dl/horovod-$HOROVOD_VERSION.tar.gz" | head -n1) \
    || die "sdist horovod-$HOROVOD_VERSION.tar.gz not downloaded"
if [[ -n $HOROVOD_SDIST_SHA256 ]]; then
    echo "$HOROVOD_SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || die "sdist sha256 mismatch"
fi
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/horovod-$HOROVOD_VERSION"
[[ -f $SRC/setup.py ]] || die "unexpected sdist layout"

# Minimal fix: C++14 -> C++17 in exactly these two files; fail loudly if the pattern moved.
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    n=$(grep -cE '^[[:space:]]*set\(CMAKE_CXX_STANDARD 14\)' "$SRC/$f" || true)
    [[ $n == 1 ]] || die "$f: expected exactly one 'set(CMAKE_CXX_STANDARD 14)', found $n; horovod $HOROVOD_VERSION needs a new patch (or none)"
    sed -i -E 's/^([[:space:]]*set\(CMAKE_CXX_STANDARD) 14\)/\1 17)/' "$SRC/$f"
    grep -qE '^[[:space:]]*set\(CMAKE_CXX_STANDARD 17\)' "$SRC/$f" || die "$f: patch did not apply"
done
log "patched CMAKE_CXX_STANDARD 14 -> 17"

# Horovod's setup.py builds RelWithDebInfo: -O3 (its CMakeLists raises -O2) plus -g. The debug info is ~100 MB of
# the wheel (and of the Horovod image) that nobody reads, and ~30% of the compile's CPU time (measured on
# horovod/torch/mpi_ops_v2.cc: 40 s -> 28 s). Release is the same -O3 -DNDEBUG without -g.
n=$(grep -c "else 'RelWithDebInfo'" "$SRC/setup.py" || true)
[[ $n == 1 ]] || die "setup.py: expected exactly one \"else 'RelWithDebInfo'\", found $n; horovod $HOROVOD_VERSION needs a new patch"
sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$SRC/setup.py"
log "patched setup.py: CMAKE_BUILD_TYPE Release (-O3, no debug info)"

# TensorFlow ops only (HOROVOD_WITH_TENSORFLOW=1; verified with TF 2.21.0): TF >= 2.18 moved
# xla_builder.h, dropped xla::StatusOr and ships highwayhash/farmhash headers under include/external,
# which its compile flags do not add. Same minimal spirit: fix the include path and the type name.
if [[ -n ${HOROVOD_WITH_TENSORFLOW:-} ]]; then
    f=horovod/tensorflow/xla_mpi_ops.cc
    sed -i 's#"tensorflow/compiler/xla/client/xla_builder.h"#"xla/hlo/builder/xla_builder.h"#; s/::xla::StatusOr</::absl::StatusOr</g' "$SRC/$f"
    grep -q 'xla/hlo/builder/xla_builder.h' "$SRC/$f" || die "$f: include patch did not apply"
    # Its code is all under HAVE_GPU, its XLA and TF headers are not: a CPU build parsed them for an empty object
    # (about 25 s of a compile's CPU). The headers now sit under the same condition as the code.
    sed -i '0,/^#if TENSORFLOW_VERSION >= 2006000000$/s//#if TENSORFLOW_VERSION >= 2006000000 \&\& HAVE_GPU/' "$SRC/$f"
    grep -q '^#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU$' "$SRC/$f" || die "$f: HAVE_GPU patch did not apply"
    "$PY" - "$SRC/horovod/tensorflow/CMakeLists.txt" <<'PYEOF' || die "horovod/tensorflow/CMakeLists.txt: anchor not found"
import sys
path = sys.argv[1]
text = open(path).read()
anchor = "include_directories(SYSTEM ${Tensorflow_INCLUDE_DIRS})\n"
if text.count(anchor) != 1:
    sys.exit(1)
extra = """foreach(_hvd_d external/highwayhash external/farmhash_archive/src)
    if(EXISTS "${Tensorflow_INCLUDE_DIRS}/${_hvd_d}")
        include_directories(SYSTEM "${Tensorflow_INCLUDE_DIRS}/${_hvd_d}")
    endif()
endforeach()
"""
open(path, "w").write(text.replace(anchor, anchor + extra))
PYEOF
    log "patched horovod/tensorflow for TF >= 2.18 headers (xla_builder.h path, absl::StatusOr, external includes; the XLA ops' headers only with HAVE_GPU)"
    # A TensorFlow built with C++17 got a second Gloo, compatible17_gloo: the same sources compiled again with
    # -std=c++17 (37 objects, about 30 s of the compile's CPU). With the new C++ ABI (TensorFlow_CXX11, as torch,
    # whose ops link the plain gloo compiled as torch's are) the TensorFlow ops link that same gloo; the old ABI keeps
    # its own copy. Gloo's headers and library use no C++17-dependent layout; the wheel check imports both frameworks'
    # ops and runs them over Gloo (venv.sh, the Horovod tier).
    "$PY" - "$SRC/CMakeLists.txt" "$SRC/horovod/tensorflow/CMakeLists.txt" <<'PYEOF' || die "CMakeLists.txt: compatible17_gloo anchors not found"
import sys
edits = {sys.argv[1]: ("if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17))\n",
                       "if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17) AND NOT Tensorflow_CXX11)\n"),
         sys.argv[2]: ("    if (Tensorflow_CXX17)\n       list(APPEND TF_LINKER_LIBS compatible17_gloo)\n",
                       "    if (Tensorflow_CXX17 AND NOT Tensorflow_CXX11)\n       list(APPEND TF_LINKER_LIBS compatible17_gloo)\n")}
for path, (old, new) in edits.items():
    text = open(path).read()
    if text.count(old) != 1:
        sys.exit(1)
    open(path, "w").write(text.replace(old, new))
PYEOF
    log "patched CMakeLists.txt: the TensorFlow ops link the one gloo (new C++ ABI), no compatible17_gloo"
    # horovod.tensorflow.keras takes its backend from a bare `import keras`, which is Keras 3 since TF 2.16
    # even when tf.keras is tf-keras (TF_USE_LEGACY_KERAS=1): Keras 3's backend has no constant/get_value/
    # set_value, so the learning-rate callbacks fail in the first batch and MetricAverageCallback at the end of
    # the first epoch.
    # Take the backend of the keras these modules already use, tf.keras, instead.
    for f in horovod/tensorflow/keras/__init__.py horovod/tensorflow/keras/callbacks.py; do
        grep -q '^from tensorflow import keras$' "$SRC/$f" || die "$f: 'from tensorflow import keras' not found"
        n=$(grep -c '^    from keras import backend as K$' "$SRC/$f" || true)
        [[ $n == 1 ]] || die "$f: expected exactly one 'from keras import backend as K', found $n"
        sed -i 's/^    from keras import backend as K$/    K = keras.backend  # tf.keras: tf-keras under TF_USE_LEGACY_KERAS=1/' "$SRC/$f"
    done
    log "patched horovod/tensorflow/keras to take tf.keras's backend (not a bare import keras)"
    # The learning-rate callbacks' momentum correction sets optimizer.momentum with the backend's set_value:
    # tf-keras's current optimizers keep momentum as a Python float (fixed in the compiled train step), so it
    # fails there ('float' object has no attribute 'dtype'). Correct only a momentum variable (legacy
    # optimizers); otherwise warn and leave it, as for optimizers without momentum.
    "$PY" - "$SRC/horovod/_keras/callbacks.py" <<'PYEOF' || die "horovod/_keras/callbacks.py: momentum-correction anchors not found"
import sys
path = sys.argv[1]
text = open(path).read()
condition = "        if hasattr(self.model.optimizer, 'momentum') and self.momentum_correction:\n"
anchor = "import tensorflow as tf\n"
if text.count(condition) != 1 or text.count(anchor) != 1:
    sys.exit(1)
helper = '''

def _momentum_is_variable(optimizer):
    """Momentum correction sets the optimizer's momentum, which must be a variable for that (legacy optimizers).
    tf-keras's current optimizers keep it as a float, fixed in the compiled train step: no correction then."""
    momentum = getattr(optimizer, 'momentum', None)
    if momentum is None or isinstance(momentum, tf.Variable):
        return momentum is not None
    warnings.warn('Horovod: momentum correction skipped, the optimizer keeps its momentum as a constant '
                  '(tf.keras.optimizers.legacy.SGD keeps it as a variable)', stacklevel=3)
    return False
'''
text = text.replace(anchor, anchor + helper).replace(
    condition, "        if self.momentum_correction and _momentum_is_variable(self.model.optimizer):\n")
open(path, "w").write(text)
PYEOF
    log "patched horovod/_keras/callbacks.py: momentum correction only for a momentum variable"
fi

# TensorFlow's C++ headers (430 MB) trimmed from the venv (images/slim_venv.sh in the TensorFlow image's lock layer,
# which the Horovod CPU image's builder starts from): back from TensorFlow's own wheel of the same version, for the
# compile only (the Horovod builder trims them again at its end). A served wheel never gets here.
if [[ $TF_VERSION != none ]]; then
    TF_SITE=$("$PY" -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("tensorflow").origin)))')
    if [[ ! -d $TF_SITE/tensorflow/include ]]; then
        log "tensorflow's C++ headers were trimmed from $TF_SITE: taking them from tensorflow==$TF_VERSION's wheel"
        "$PY" -m pip download --disable-pip-version-check --no-deps --no-cache-dir -q -d "$WORK/tensorflow" \
            "tensorflow==$TF_VERSION" || die "cannot download tensorflow==$TF_VERSION for its C++ headers"
        "$PY" - "$TF_SITE" "$WORK"/tensorflow/tensorflow-*.whl <<'PYEOF' || die "no tensorflow/include in the wheel"
import sys, zipfile
site, wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    headers = [n for n in z.namelist() if n.startswith("tensorflow/include/")]
    z.extractall(site, headers)
sys.exit(not headers)
PYEOF
    fi
fi

log "building (MAKEFLAGS=$MAKEFLAGS $FLAGS tensorflow=$TF_VERSION); about 5 min on 2 cores (CPU/gloo)"
extra=()
[[ ${HOROVOD_BUILD_VERBOSE:-0} == 1 ]] && extra+=(-v)
# PEP 517 path (setuptools.build_meta, no `wheel` package needed); newer pips (>= 25.3)
# always do this and may not know the flag any more.
"$PY" -m pip wheel --help 2>/dev/null | grep -- '--use-pep517' >/dev/null && extra+=(--use-pep517)
"$PY" -m pip wheel --disable-pip-version-check --no-build-isolation --no-deps --no-cache-dir \
    "${extra[@]}" -w "$WORK/wheel" "$SRC"
WHEEL=$(compgen -G "$WORK/wheel/horovod-$HOROVOD_VERSION-*.whl" | head -n1) || die "no wheel produced"
check_wheel "$WHEEL" || die "built wheel $WHEEL is incomplete"

# Atomic cache write: temp name in the same dir, then rename.
mkdir -p "$CACHE_DIR"
printf '%s\n' "$KEY_MATERIAL" > "$CACHE_DIR/key.txt.partial.$$"
mv -f "$CACHE_DIR/key.txt.partial.$$" "$CACHE_DIR/key.txt"
cp "$WHEEL" "$CACHE_DIR/.$(basename "$WHEEL").partial.$$"
mv -f "$CACHE_DIR/.$(basename "$WHEEL").partial.$$" "$CACHE_DIR/$(basename "$WHEEL")"
out=$(copy_out "$WHEEL")
ELAPSED=$(( $(date +%s) - START ))
printf 'horovod wheel: built in %dm%02ds (%ds), cached as %s -> %s\n' \
    $((ELAPSED / 60)) $((ELAPSED % 60)) "$ELAPSED" "$CACHE_DIR/$(basename "$WHEEL")" "$out"
