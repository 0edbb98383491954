"""examples/nw_regression.py in a smoke run: metrics.json, PNGs that say what they show, and
sane numbers."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from keras_attn import viz

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name):
    """A fresh copy of the script (its siblings, such as example_utils, come from `examples/`
    on the tests' path: setup.cfg's `pythonpath`)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def figures(monkeypatch):
    """The figures the example saves, by file name (the files are still written)."""
    saved = {}
    save = viz._save

    def capture(fig, path):
        saved[pathlib.Path(path).stem] = fig
        return save(fig, path)

    monkeypatch.setattr(viz, "_save", capture)
    return saved


def test_nw_regression_smoke(tmp_path, figures):
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

    # Each fit plot shows its test MSE, and the training points are in the legend.
    for name, value in mse.items():
        ax = figures[f"fit_{name}"].axes[0]
        assert f"test MSE {value:.4f}" in ax.get_title()
        assert "training data (noisy)" in [t.get_text() for t in ax.get_legend().get_texts()]
    # The two attention maps share one colour scale and are drawn against x, not indices.
    scales = set()
    for name in ("nonparametric_nw", "parametric_nw"):
        fig = figures[f"attention_{name}"]
        panel = next(ax for ax in fig.axes if ax.get_label() != "<colorbar>")
        scales.add(panel.collections[0].get_clim())
        low, high = panel.get_xlim()
        assert -0.5 < low < 0.5 and 4.5 < high < 5.5, (low, high)
        assert "x_i" in panel.get_xlabel() and "x" in panel.get_ylabel()
    assert len(scales) == 1 and scales.pop()[0] == 0.0
    history = figures["history"].axes[0]
    assert history.get_xlabel() == "epoch" and history.get_ylabel() == "loss"
    assert np.all(np.mod(history.get_xticks(), 1) == 0)
