"""Tests of keras_attn.viz: PNG files are written, the figures say what they show (titles,
labelled colorbars and axes, legends), shared colour scales, labels that never overlap, and bad
inputs raise ValueError."""

import keras
import matplotlib
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from keras_attn import viz
from keras_attn.data import make_kernel_regression_data

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    with open(path, "rb") as file:
        return file.read(8) == PNG_MAGIC


@pytest.fixture()
def figures(monkeypatch):
    """The figures the plots save, in order (the files are still written)."""
    saved = []
    save = viz._save

    def capture(fig, path):
        saved.append(fig)
        return save(fig, path)

    monkeypatch.setattr(viz, "_save", capture)
    return saved


def _renderer(fig):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _all_texts(fig):
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]


def _overlaps(boxes):
    """Pairs of boxes that overlap by more than half a pixel in both directions."""
    found = []
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            if (min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5
                    and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5):
                found.append((i, j))
    return found


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


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("sources,outputs", [
    (["the", "3rd", "of", "september", ",", "2", "0", "2", "1", "everywhere", ".", "!"],
     list("2021-09-0")),
    (["september", "1", "4", ",", "'", "0", "8"], list("2008-09-04") + ["<eos>"]),
])
def test_heatmap_labels_appear_once_and_never_overlap(num_heads, sources, outputs, tmp_path,
                                                      figures):
    """Per-head panels side by side, as the Transformer example draws them: one shared axis
    label each way, a labelled colorbar, and no two texts drawn over each other."""
    rng = np.random.default_rng(0)
    weights = rng.random((1, num_heads, len(outputs), len(sources)))
    weights /= weights.sum(-1, keepdims=True)
    viz.show_heatmaps(weights, "source tokens", "output tokens",
                      titles=[f"head {h + 1}" for h in range(num_heads)],
                      xticklabels=sources, yticklabels=outputs,
                      suptitle="Cross-attention of the last decoder layer (layer 2 of 2), one "
                               "panel per head\ninput: 'the 3rd of september, 2021'\n"
                               "prediction: '2021-09-03'",
                      path=str(tmp_path / "h.png"))
    fig = figures[-1]
    texts = _all_texts(fig)
    assert texts.count("source tokens") == 1 and texts.count("output tokens") == 1
    colorbar_axes = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colorbar_axes) == 1
    assert colorbar_axes[0].get_ylabel() == "attention weight"
    renderer = _renderer(fig)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == num_heads
    # The x tick labels of all panels (the words), titles, the shared labels and the suptitle.
    boxes = [t.get_window_extent(renderer) for ax in panels for t in ax.get_xticklabels()
             if t.get_visible() and t.get_text()]
    assert len(boxes) == num_heads * len(sources)
    boxes += [ax.title.get_window_extent(renderer) for ax in panels]
    boxes += [t.get_window_extent(renderer) for t in fig.texts if t.get_text()]
    assert _overlaps(boxes) == []
    # The y tick labels are those of the first panel only (they are shared).
    assert [t.get_text() for t in panels[0].get_yticklabels()] == outputs
    assert all(not t.get_visible() or not t.get_text()
               for ax in panels[1:] for t in ax.get_yticklabels())


def test_heatmap_colour_scale_is_shared_and_starts_at_zero(tmp_path, figures):
    rng = np.random.default_rng(1)
    weights = rng.random((2, 2, 3, 4)) * np.array([1.0, 0.1])[None, :, None, None] + 0.2
    viz.show_heatmaps(weights, "k", "q", path=str(tmp_path / "a.png"))
    images = [ax.images[0] for ax in figures[-1].axes if ax.images]
    assert len(images) == 4
    # Weights are non-negative: the scale starts at 0, so near-uniform weights look uniform.
    assert {image.get_clim() for image in images} == {(0.0, float(weights.max()))}
    # Two figures meant to be compared get one scale; values above it are marked on the bar.
    viz.show_heatmaps(weights, "k", "q", path=str(tmp_path / "b.png"), vmin=0.0, vmax=0.5)
    images = [ax.images[0] for ax in figures[-1].axes if ax.images]
    assert {image.get_clim() for image in images} == {(0.0, 0.5)}
    colorbar = next(image.colorbar for image in images if image.colorbar is not None)
    assert colorbar.extend == "max"


def test_heatmap_numeric_positions(tmp_path, figures):
    """With `xvalues` / `yvalues` the axes are in the units of the inputs, not indices."""
    data = make_kernel_regression_data()
    weights = np.random.default_rng(0).random((1, 1, len(data.x_test), len(data.x_train)))
    viz.show_heatmaps(weights, "training inputs x_i", "test inputs x", path=str(tmp_path / "n.png"),
                      xvalues=data.x_train, yvalues=data.x_test)
    ax = figures[-1].axes[0]
    low, high = ax.get_xlim()
    assert low <= data.x_train.min() and high >= data.x_train.max()
    assert high - low < 6  # the inputs lie in [0, 5): not 50 indices
    bottom, top = ax.get_ylim()
    assert top < bottom  # the first query on top, as imshow draws it
    assert ax.get_xlabel() == "training inputs x_i"


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
    with pytest.raises(ValueError, match="row_titles"):
        viz.show_heatmaps(np.ones((2, 1, 2, 3)), "k", "q", row_titles=["a"],
                          path=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="vmin"):
        viz.show_heatmaps(np.ones((1, 1, 2, 3)), "k", "q", vmin=1.0, vmax=0.5,
                          path=str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match="xvalues"):
        viz.show_heatmaps(np.ones((1, 1, 2, 3)), "k", "q", xvalues=[0.0, 2.0, 1.0],
                          path=str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_plot_kernel_reg(tmp_path, figures):
    data = make_kernel_regression_data()
    y_hat = data.y_truth * 0.9
    y_hat[3] = -7.0  # far outside d2l's fixed [-1, 5] window: it must still be drawn
    path = viz.plot_kernel_reg(
        data.x_test,
        data.y_truth,
        y_hat,
        data.x_train,
        data.y_train,
        path=str(tmp_path / "k.png"),
        title="fit\ntest MSE 0.1234",
    )
    assert _is_png(path)
    ax = figures[-1].axes[0]
    assert ax.get_title() == "fit\ntest MSE 0.1234"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["training data (noisy)", "true function", "prediction"]
    assert ax.get_xlabel() == "x" and ax.get_ylabel() == "y"
    assert ax.get_ylim()[0] <= -7.0
    with pytest.raises(ValueError, match="y_hat"):
        viz.plot_kernel_reg(
            data.x_test,
            data.y_truth,
            data.y_truth[:3],
            data.x_train,
            data.y_train,
            path=str(tmp_path / "k.png"),
        )


@pytest.mark.parametrize("num_epochs", [1, 3, 30])
def test_plot_history_axes(num_epochs, tmp_path, figures):
    history = {
        "loss": list(np.linspace(2.0, 0.5, num_epochs)),
        "val_loss": list(np.linspace(2.1, 0.9, num_epochs)),
        "masked_accuracy": list(np.linspace(0.1, 0.8, num_epochs)),
    }
    assert _is_png(viz.plot_history(history, path=str(tmp_path / "h.png"), title="run"))
    fig = figures[-1]
    loss_ax, accuracy_ax = fig.axes
    for ax, name in ((loss_ax, "loss"), (accuracy_ax, "masked_accuracy")):
        assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == name
        _renderer(fig)
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() and 1 <= t <= num_epochs for t in ticks)
    assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == ["training",
                                                                        "validation"]
    assert [t.get_text() for t in accuracy_ax.get_legend().get_texts()] == ["training"]


def test_plot_history_validates(tmp_path):
    history = {"loss": [2.0, 1.0], "val_loss": [2.1, 1.2]}

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
