"""Tests of keras_attn.viz: PNG files are written, bad inputs raise ValueError."""

import keras
import matplotlib
import numpy as np
import pytest

from keras_attn import viz
from keras_attn.data import make_kernel_regression_data

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    with open(path, "rb") as file:
        return file.read(8) == PNG_MAGIC


def test_import_keeps_pyplot_backend():
    before = matplotlib.get_backend()
    import importlib

    importlib.reload(viz)
    assert matplotlib.get_backend() == before


@pytest.mark.parametrize("as_tensor", [False, True])
def test_show_heatmaps_writes_png(tmp_path, as_tensor):
    weights = np.random.default_rng(0).random((2, 3, 4, 5))
    weights /= weights.sum(-1, keepdims=True)
    matrices = keras.ops.convert_to_tensor(weights) if as_tensor else weights
    path = viz.show_heatmaps(
        matrices,
        "Keys",
        "Queries",
        titles=["h1", "h2", "h3"],
        path=str(tmp_path / "a" / "h.png"),
        figsize=(7, 4),
        xticklabels=list("abcde"),
        yticklabels=list("wxyz"),
    )
    assert path == str(tmp_path / "a" / "h.png") and _is_png(path)


def test_show_heatmaps_validates(tmp_path):
    with pytest.raises(ValueError, match="matrices"):
        viz.show_heatmaps(np.eye(3), "k", "q", path=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="xticklabels"):
        viz.show_heatmaps(
            np.ones((1, 1, 2, 3)),
            "k",
            "q",
            xticklabels=["a"],
            path=str(tmp_path / "x.png"),
        )
    with pytest.raises(ValueError, match="titles"):
        viz.show_heatmaps(
            np.ones((1, 2, 2, 3)), "k", "q", titles=["a"], path=str(tmp_path / "x.png")
        )


def test_plot_kernel_reg(tmp_path):
    data = make_kernel_regression_data()
    path = viz.plot_kernel_reg(
        data.x_test,
        data.y_truth,
        data.y_truth * 0.9,
        data.x_train,
        data.y_train,
        path=str(tmp_path / "k.png"),
        title="fit",
    )
    assert _is_png(path)
    with pytest.raises(ValueError, match="y_hat"):
        viz.plot_kernel_reg(
            data.x_test,
            data.y_truth,
            data.y_truth[:3],
            data.x_train,
            data.y_train,
            path=str(tmp_path / "k.png"),
        )


def test_plot_history(tmp_path):
    history = {
        "loss": [2.0, 1.0, 0.5],
        "val_loss": [2.1, 1.2, 0.9],
        "masked_accuracy": [0.1, 0.5, 0.8],
    }
    assert _is_png(viz.plot_history(history, path=str(tmp_path / "h.png")))

    class FakeHistory:  # what model.fit returns: an object with a `.history` dict
        pass

    fake = FakeHistory()
    fake.history = history
    assert _is_png(
        viz.plot_history(fake, path=str(tmp_path / "h2.png"), metrics=["loss"])
    )
    with pytest.raises(ValueError, match="metrics"):
        viz.plot_history(history, path=str(tmp_path / "h3.png"), metrics=["bleu"])
    with pytest.raises(ValueError, match="history"):
        viz.plot_history({}, path=str(tmp_path / "h4.png"))
