"""Serving a SavedModel as its consumer does: a fresh interpreter with TensorFlow and
tensorflow-text's op libraries, where Keras and keras_attn cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys

# tensorflow-text's package imports tf.keras; its op libraries alone are what the graph needs.
PROLOGUE = """
import glob, importlib.util, json, os, sys
sys.modules["keras"] = None
sys.modules["keras_attn"] = None
import tensorflow as tf
ops = os.path.join(importlib.util.find_spec("tensorflow_text").submodule_search_locations[0],
                   "python", "ops")
for library in sorted(glob.glob(os.path.join(ops, "*.so"))):
    tf.load_op_library(library)


def imported():
    # The libraries a consumer should not need that were imported anyway.
    return sorted({m.split(".")[0] for m, v in sys.modules.items() if v} & {
        "keras", "keras_attn", "keras_hub", "torch", "transformers"})
"""


def serve(script: str, *args: str) -> dict:
    """Run `PROLOGUE + script` with `args` (its `sys.argv[1:]`) in a fresh interpreter; the
    JSON dict its last printed line holds. The script may call `imported()`: the libraries
    (Keras, keras_attn, torch, ...) imported while serving, which should be none."""
    result = subprocess.run([sys.executable, "-c", PROLOGUE + script, *args],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
