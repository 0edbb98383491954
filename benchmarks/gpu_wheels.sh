#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_check.sh installs on a GPU machine that has Python 3.12,
# CUDA builds of JAX and torch, transformers, numpy, absl-py, rich, h5py, ml-dtypes, packaging,
# regex, safetensors and tokenizers, but no TensorFlow, Keras or network.
#
#     bash benchmarks/gpu_wheels.sh DIR
#
# keras needs absl-py, numpy, rich, h5py, ml-dtypes, packaging (there) and namex, optree (here);
# optree needs typing-extensions (torch's dependency, there). keras-hub needs keras, absl-py,
# numpy, packaging, regex, rich, tokenizers (there); kagglehub, kagglesdk, sentencepiece and
# tensorflow-text are imported only when present (loading presets, SentencePiece and
# TensorFlow tokenizers: none is used by the check). keras_attn itself is pure Python and runs
# from the repository (gpu_check.sh puts it on PYTHONPATH).
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/gpu_wheels.sh DIR" >&2
    exit 2
fi
DIR=$1
mkdir -p "$DIR"
# The versions keras_attn is tested with here.
KERAS=$(python -c "import keras; print(keras.__version__)")
HUB=$(python -c "from importlib.metadata import version; print(version('keras-hub'))")
pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any \
    -d "$DIR" "keras==$KERAS" "keras-hub==$HUB" namex optree
ls -1 "$DIR"
