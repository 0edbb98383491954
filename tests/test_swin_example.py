"""examples/swin_digits.py: a smoke run writes sane metrics, heatmaps and a SavedModel that
serves the same predictions; the slow test trains with the defaults to >= 95% test accuracy."""

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "swin_digits.py")


def load_example():
    """A fresh copy of the script (its siblings, such as example_utils, come from `examples/`
    on the tests' path: setup.cfg's `pythonpath`)."""
    spec = importlib.util.spec_from_file_location("swin_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(tmp_path, *extra):
    out = tmp_path / "out"
    export = out / "saved_model"  # the default: everything a run makes is in OUT
    metrics = load_example().main(["--out", str(out), *extra])
    with open(out / "metrics.json") as f:
        assert json.load(f) == metrics
    return metrics, out, export


def test_smoke_run_writes_metrics_heatmaps_and_export(tmp_path):
    metrics, out, export = run(tmp_path, "--smoke", "--epochs", "1")
    assert metrics["num_train"] == 200 and metrics["num_test"] == 100
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    assert np.isfinite(metrics["test_loss"]) and metrics["train_seconds"] > 0
    assert metrics["export_max_abs_diff"] < 1e-5
    assert metrics["export_dir"] == str(export)
    assert (out / "history.png").stat().st_size > 5000
    assert len(metrics["heatmaps"]) == 2
    for path in metrics["heatmaps"]:
        assert os.path.dirname(path) == str(out)
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(path) > 5000
    reloaded = tf.saved_model.load(str(export))  # keep a reference: it owns the variables
    served = reloaded.serve(tf.zeros((3, 8, 8, 1)))
    assert tuple(served.shape) == (3, 10)
    assert np.all(np.isfinite(served.numpy()))
    # A second run into the same OUT is refused (before training) unless asked to overwrite.
    with pytest.raises(SystemExit) as refused:
        load_example().main(["--out", str(out), "--smoke", "--epochs", "1"])
    assert refused.value.code == 2


@pytest.mark.slow
def test_default_run_reaches_95_percent(tmp_path):
    metrics, _, _ = run(tmp_path)
    assert metrics["test_accuracy"] >= 0.95, metrics
