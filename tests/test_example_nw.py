"""examples/nw_regression.py in a smoke run: metrics.json, PNGs, and sane numbers."""

import importlib.util
import json
import pathlib

import pytest

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nw_regression_smoke(tmp_path):
    metrics = load_example("nw_regression").main(["--epochs", "3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["test_mse"] == metrics["test_mse"]
    mse = saved["test_mse"]
    # Attention to nearby points beats ignoring the query on this data.
    assert mse["nonparametric_nw"] < mse["average_pooling"]
    assert saved["train_seconds"] > 0
    for png in ("fit_average_pooling", "fit_nonparametric_nw", "fit_parametric_nw",
                "attention_nonparametric_nw", "attention_parametric_nw", "history"):
        assert (tmp_path / f"{png}.png").stat().st_size > 1000
