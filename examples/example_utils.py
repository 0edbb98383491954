"""What every example script shares before TensorFlow is imported: a quiet TensorFlow start,
number options checked when they are parsed, and run directories that never silently replace
an earlier run's results.

Imported by the scripts before anything that imports TensorFlow or Keras: `--help` and a
refused option answer at once. What the scripts need once their arguments are parsed (the
export that replaces an earlier SavedModel only once written, `fit_verbosity`, the time-budget
schedule) and the translation recipe are in `keras_attn.recipes`, imported after parsing and
after `import_tensorflow_quietly()` (importing `keras_attn` imports TensorFlow).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# TensorFlow's C++ libraries write these to the process's stderr while they load, before
# `TF_CPP_MIN_LOG_LEVEL` is read, and on a machine without a GPU they look like failures.
_NOISE_PATTERNS = (
    r"All log messages before absl::InitializeLog\(\) is called",
    r"oneDNN custom operations are on",
    r"Could not find cuda drivers",
    r"failed call to cuInit",
    r"cuda_(diagnostics|driver|executor)\.cc",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation_placer\.cc",
    r"cpu_feature_guard\.cc",
    r"To enable the following instructions",
    r"TF-TRT Warning",
)
_NOISE = re.compile("|".join(_NOISE_PATTERNS))


def import_tensorflow_quietly():
    """Imports TensorFlow (and looks for GPUs, which is when cuInit runs) with the loader's
    start-up notices about oneDNN and missing CUDA drivers filtered out of stderr.

    Anything else written to stderr meanwhile is passed on unchanged. A no-op when TensorFlow
    is already imported.

    Returns:
        The `tensorflow` module.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices("GPU")
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines()
                    if not _NOISE.search(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr)
    return tf


def _is_saved_model(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "saved_model.pb"))


def check_run_dirs(out: str, export_dir: str | None, overwrite: bool) -> str | None:
    """Why this run would replace an earlier run's results, or None when it would not.

    A finished run leaves `OUT/metrics.json`; an export leaves a SavedModel. Both are kept
    unless `overwrite`. Checked before training, so a refused run costs nothing.

    Args:
        out: the run directory.
        export_dir: the SavedModel directory, or None when the script exports nothing.
        overwrite: bool, the user asked to replace earlier results.

    Returns:
        An error message for the user, or None.
    """
    if export_dir is not None and os.path.exists(export_dir) and (
        not os.path.isdir(export_dir) or (os.listdir(export_dir) and
                                          not _is_saved_model(export_dir))):
        return (f"--export-dir {export_dir} exists and is not a SavedModel directory; "
                "choose another --export-dir (it is never deleted, even with --overwrite)")
    if overwrite:
        return None
    if os.path.isfile(os.path.join(out, "metrics.json")):
        return (f"{out} already holds the results of an earlier run (metrics.json); pass "
                "--overwrite to replace them, or choose another --out")
    if export_dir is not None and os.path.isdir(export_dir) and os.listdir(export_dir):
        return (f"{export_dir} already holds a SavedModel from an earlier run; pass "
                "--overwrite to replace it, or choose another --out or --export-dir")
    return None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                    argparse.RawDescriptionHelpFormatter):
    """`--help` with every option's default shown (unless its help says it, or it has none)
    and the description's and epilog's lines kept as written."""

    def _get_help_string(self, action):
        if "(default" in (action.help or "") or action.default is None:
            return action.help
        return super()._get_help_string(action)


def number(minimum: float | None = None, strict: bool = False, maximum: float | None = None,
           strict_maximum: bool = False) -> Callable[[str], float]:
    """An argparse `type` for a float option: finite (nan and inf refused) and in range.

    Args:
        minimum: the smallest value allowed, or None. Defaults to `None`.
        strict: the value must be `> minimum`, not `>=`. Defaults to `False`.
        maximum: the largest value allowed, or None. Defaults to `None`.
        strict_maximum: the value must be `< maximum`. Defaults to `False`.

    Returns:
        A function of the option's text: the float, or `argparse.ArgumentTypeError` (argparse
        then exits with status 2, naming the option and the value).
    """
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if strict else '>='} {minimum:g}")
    if maximum is not None:
        bounds.append(f"{'<' if strict_maximum else '<='} {maximum:g}")
    expected = "a finite number" + (" " + " and ".join(bounds) if bounds else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (minimum is not None and (
                value <= minimum if strict else value < minimum)) or (
                maximum is not None and (value >= maximum if strict_maximum
                                         else value > maximum)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


# The float options of the examples.
positive = number(0, strict=True)  # learning rates, seconds
non_negative = number(0)  # temperatures, penalties
rate = number(0, maximum=1, strict_maximum=True)  # dropout, label smoothing: [0, 1)
