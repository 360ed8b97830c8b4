#!/usr/bin/env bash
# The Horovod venv's own step (images/horovod/image.toml [venv] after), run by `make venv-horovod` once the lock is in:
# Horovod built from its sdist with the C++17 fix (build_horovod_wheel.sh), with PyTorch and TensorFlow ops as in the
# Horovod CPU image. The wheel is cached under ~/.cache/trainer-images/wheels, so only a fresh machine pays the build
# (~4 minutes on 2 cores, a Release build: no debug info); the Horovod image build of `make image-test` waits for this
# venv and takes the same wheel instead of compiling.
# Its compile runs 2 x nproc + 2 jobs of its own, not on `make test`'s job slots: those are held by the test tiers for
# their whole run. On a fresh machine the compile, the Horovod image build and its container tests are the longest
# chain of `make test`, and the compile shares the cores with every test tier: with nproc + 1 compilers it got about
# 0.4 of a core and took 16 to 20 min under load, so it runs as many compilers as the tiers have busy processes.
#
#   usage: images/horovod/venv.sh VENV
set -euo pipefail
venv=${1:?usage: venv.sh VENV}
pip=("$venv/bin/pip" --disable-pip-version-check)
MAKEFLAGS= HOROVOD_BUILD_PARALLELISM=$(( 2 * $(nproc) + 2 )) HOROVOD_WITH_TENSORFLOW=1 \
    bash "$(dirname "$0")/build_horovod_wheel.sh" "$venv/bin/python" "$venv/wheels"
"${pip[@]}" install -q --no-deps "$venv"/wheels/horovod-*.whl
"${pip[@]}" check
# Both frameworks' ops load, with the Gloo controller, in one process: what `horovodrun --check-build` reports, without
# an interpreter per framework and check (22.7 s of CPU alone, 37 s in a fresh `make test`; this, 6.6 s).
"$venv/bin/python" -c 'import horovod.torch as t, horovod.tensorflow as tf, horovod.tensorflow.keras
assert t.gloo_built() and tf.gloo_built() and not t.mpi_built(), "Horovod built without Gloo, or with MPI"
import horovod; print("horovod", horovod.__version__, "with its torch and tensorflow ops, gloo built")'
