"""Plots that write PNG files: attention heatmaps, kernel regression fits, training curves.

Figures are built as `matplotlib.figure.Figure` objects and saved with the Agg renderer, so the
module works headless and importing it never changes pyplot's global backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import keras
import numpy as np
from matplotlib.figure import Figure


def _to_numpy(name: str, value) -> np.ndarray:
    try:
        return np.asarray(keras.ops.convert_to_numpy(value), dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Argument `{name}` must be a numeric array or tensor. Received: {type(value).__name__}"
        ) from error


def _save(fig: Figure, path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


def show_heatmaps(
    matrices,
    xlabel: str,
    ylabel: str,
    titles: Sequence[str] | None = None,
    path: str = "heatmaps.png",
    figsize: tuple[float, float] = (2.5, 2.5),
    cmap: str = "Reds",
    xticklabels: Sequence[str] | None = None,
    yticklabels: Sequence[str] | None = None,
) -> str:
    """Draws a grid of attention-weight heatmaps with one shared colorbar (d2l's `show_heatmaps`).

    All panels share one color scale, so the colorbar is true for every panel.

    Args:
        matrices: array or tensor `(num_rows, num_cols, num_queries, num_keys)`, e.g.
            `(num_layers, num_heads, T, S)` attention weights.
        xlabel: str, label of the key axis (bottom row only).
        ylabel: str, label of the query axis (first column only).
        titles: list of `num_cols` column titles. Defaults to `None`.
        path: str, PNG file to write. Defaults to `"heatmaps.png"`.
        figsize: `(width, height)` of the whole figure in inches, as in d2l.
            Defaults to `(2.5, 2.5)`.
        cmap: str, matplotlib colormap. Defaults to `"Reds"`.
        xticklabels: list of `num_keys` key tokens, used for every panel. Defaults to `None`.
        yticklabels: list of `num_queries` query tokens, used for every panel. Defaults to `None`.

    Returns:
        str, `path`.

    Example:
    >>> show_heatmaps(np.eye(10).reshape(1, 1, 10, 10), "Keys", "Queries", path="eye.png")
    'eye.png'
    """
    matrices = _to_numpy("matrices", matrices)
    if matrices.ndim != 4:
        raise ValueError(
            "Argument `matrices` must have rank 4: (num_rows, num_cols, num_queries, num_keys). "
            f"Received: matrices.shape={matrices.shape}"
        )
    num_rows, num_cols, num_queries, num_keys = matrices.shape
    for name, labels, expected in (
        ("titles", titles, num_cols),
        ("xticklabels", xticklabels, num_keys),
        ("yticklabels", yticklabels, num_queries),
    ):
        if labels is not None and len(labels) != expected:
            raise ValueError(
                f"Argument `{name}` must have {expected} entries to match `matrices`. "
                f"Received: len({name})={len(labels)}, matrices.shape={matrices.shape}"
            )
    fig = Figure(figsize=figsize)
    axes = fig.subplots(num_rows, num_cols, sharex=True, sharey=True, squeeze=False)
    vmin, vmax = float(np.min(matrices)), float(np.max(matrices))
    for i in range(num_rows):
        for j in range(num_cols):
            ax = axes[i, j]
            image = ax.imshow(matrices[i, j], cmap=cmap, vmin=vmin, vmax=vmax)
            if i == num_rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles is not None:
                ax.set_title(titles[j])
            if xticklabels is not None:
                ax.set_xticks(range(num_keys), labels=list(xticklabels), rotation=90)
            if yticklabels is not None:
                ax.set_yticks(range(num_queries), labels=list(yticklabels))
    fig.colorbar(image, ax=axes, shrink=0.6)
    return _save(fig, path)


def plot_kernel_reg(
    x_test,
    y_truth,
    y_hat,
    x_train,
    y_train,
    path: str = "kernel_regression.png",
    title: str | None = None,
) -> str:
    """Plots a kernel regression fit as in d2l: truth and prediction lines, training points.

    Args:
        x_test: array `(n_test,)` of test inputs.
        y_truth: array `(n_test,)`, true function values.
        y_hat: array `(n_test,)`, predictions.
        x_train: array `(n_train,)` of training inputs.
        y_train: array `(n_train,)` of noisy training targets.
        path: str, PNG file to write. Defaults to `"kernel_regression.png"`.
        title: str, figure title. Defaults to `None`.

    Returns:
        str, `path`.
    """
    x_test, y_truth, y_hat, x_train, y_train = (
        _to_numpy(name, value).reshape(-1)
        for name, value in (
            ("x_test", x_test),
            ("y_truth", y_truth),
            ("y_hat", y_hat),
            ("x_train", x_train),
            ("y_train", y_train),
        )
    )
    for name, value in (("y_truth", y_truth), ("y_hat", y_hat)):
        if value.shape != x_test.shape:
            raise ValueError(
                f"Argument `{name}` must have as many values as `x_test`. "
                f"Received: {name}.shape={value.shape}, x_test.shape={x_test.shape}"
            )
    if y_train.shape != x_train.shape:
        raise ValueError(
            "Argument `y_train` must have as many values as `x_train`. "
            f"Received: y_train.shape={y_train.shape}, x_train.shape={x_train.shape}"
        )
    fig = Figure(figsize=(3.5, 2.5))
    ax = fig.subplots()
    ax.plot(x_test, y_truth, label="Truth")
    ax.plot(x_test, y_hat, linestyle="--", label="Pred")
    ax.plot(x_train, y_train, "o", alpha=0.5)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_xlim(0, 5)
    ax.set_ylim(-1, 5)
    ax.legend()
    if title:
        ax.set_title(title)
    return _save(fig, path)


def plot_history(
    history, path: str = "history.png", metrics: Sequence[str] | None = None
) -> str:
    """Plots training curves, one panel per metric, with its `val_` curve when present.

    Args:
        history: a `keras.callbacks.History` (what `model.fit` returns) or a dict of lists,
            e.g. `{"loss": [...], "val_loss": [...]}`.
        path: str, PNG file to write. Defaults to `"history.png"`.
        metrics: list of metric names to plot. Defaults to `None` (every key not starting
            with `val_`).

    Returns:
        str, `path`.
    """
    logs: Mapping[str, Sequence[float]] = getattr(history, "history", history)
    if not isinstance(logs, Mapping) or not logs:
        raise ValueError(
            "Argument `history` must be a keras History or a non-empty dict of lists. "
            f"Received: history={history!r}"
        )
    if metrics is None:
        metrics = [key for key in logs if not key.startswith("val_")]
    missing = [name for name in metrics if name not in logs]
    if missing or not metrics:
        raise ValueError(
            f"Argument `metrics` must name keys of `history`. Received: metrics={list(metrics)}, "
            f"history keys={list(logs)}"
        )
    fig = Figure(figsize=(3.5 * len(metrics), 2.5))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, name in zip(axes, metrics):
        values = np.asarray(logs[name], dtype=np.float64)
        epochs = np.arange(1, len(values) + 1)
        ax.plot(epochs, values, label=name)
        if f"val_{name}" in logs:
            val = np.asarray(logs[f"val_{name}"], dtype=np.float64)
            ax.plot(
                np.arange(1, len(val) + 1), val, linestyle="--", label=f"val_{name}"
            )
        ax.set_xlabel("epoch")
        ax.set_title(name)
        ax.legend()
    return _save(fig, path)
