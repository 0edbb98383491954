#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): on a machine with CUDA builds of JAX and torch but
# no TensorFlow, Keras or network, install Keras, keras-hub and keras_attn's pure-Python needs
# from local wheels, then run the fused kernel's correctness checks and the comparisons with
# Keras, keras-hub and transformers on JAX and torch, and print one table. Under 8 minutes on
# one H200.
#
#     bash benchmarks/gpu_wheels.sh WHEEL_DIR        # where there is a network
#     bash benchmarks/gpu_check.sh WHEEL_DIR         # on the GPU machine, from the repository
#     bash benchmarks/gpu_check.sh --dry-run         # tiny shapes, the Keras already installed
#
# Wheels it needs in WHEEL_DIR: keras, keras_hub, namex, optree (any versions for Python 3.12;
# gpu_wheels.sh fetches the tested ones). Extra arguments go to gpu_check.py.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-python}
# gpu_check.py imports keras_attn from the repository and the tests' reference helpers from tests/
export PYTHONPATH="$ROOT:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"
if [ $# -lt 1 ]; then
    echo "usage: bash benchmarks/gpu_check.sh WHEEL_DIR [gpu_check.py options] | --dry-run" >&2
    exit 2
fi
if [ "$1" = "--dry-run" ]; then
    shift
    exec "$PYTHON" "$HERE/gpu_check.py" --dry-run "$@"
fi
WHEELS=$1
shift
SITE=$(mktemp -d "${TMPDIR:-/tmp}/keras_attn_gpu_site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
missing=()
found=()
for name in keras keras_hub namex optree; do
    wheel=$(ls "$WHEELS"/"$name"-[0-9]*.whl 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$wheel" ]; then
        missing+=("$name")
    else
        found+=("$wheel")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "gpu_check.sh: no wheel in $WHEELS for: ${missing[*]} (needs keras, keras_hub, namex," \
         "optree; bash benchmarks/gpu_wheels.sh DIR downloads them)" >&2
    exit 1
fi
echo "installing into $SITE: ${found[*]##*/}"
if "$PYTHON" -m pip --version > /dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$SITE" "${found[@]}"
else  # no pip: a wheel is a zip archive laid out for site-packages
    for wheel in "${found[@]}"; do "$PYTHON" -m zipfile -e "$wheel" "$SITE"; done
fi
export PYTHONPATH="$ROOT:$SITE:$PYTHONPATH"
for backend in jax torch; do
    KERAS_BACKEND=$backend "$PYTHON" -c "import keras, keras_hub, keras_attn; \
print('$backend: keras', keras.__version__, 'keras_hub', keras_hub.__version__)" 2>&1 | tail -n 1
done
exec "$PYTHON" "$HERE/gpu_check.py" "$@"
