#!/usr/bin/env bash
# Remove from a finished image venv what a trainer never uses (run by every Dockerfile's builder stage,
# after the lock and, for Horovod, after Horovod was compiled against these headers):
#   - C/C++ headers (torch/include, tensorflow/include): the runtime image has no compiler to use them
#   - torch's C++ test binaries (torch/test, torch/bin/test_*, torch/bin/*StoreTest) and bundled protoc
#   - the test suites inside numpy, scipy, scikit-learn and sympy (their */tests folders)
# Everything a program imports stays, pip included (docs/images.md: extending an image). Sizes before
# and after: docs/images.md "Size"; the budget: images/size-budget.json.
#
#   usage: slim_venv.sh VENV
set -euo pipefail

venv=${1:?usage: slim_venv.sh VENV}
shopt -s nullglob
sites=("$venv"/lib/python3*/site-packages)
[[ ${#sites[@]} == 1 ]] || { echo "slim_venv.sh: no single site-packages under $venv" >&2; exit 1; }
site=${sites[0]}

before=$(du -sm "$venv" | cut -f1)
rm -rf "$site/torch/include" "$site/tensorflow/include" "$site/torch/test"
rm -f "$site"/torch/bin/test_* "$site"/torch/bin/*StoreTest "$site"/torch/bin/protoc*
for package in numpy scipy sklearn sympy; do
    if [[ -d $site/$package ]]; then
        find "$site/$package" -type d -name tests -prune -exec rm -rf {} +
    fi
done
after=$(du -sm "$venv" | cut -f1)
echo "slim_venv.sh: $venv ${before} MB -> ${after} MB"
