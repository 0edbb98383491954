"""Plots that write PNG files: attention heatmaps, kernel regression fits, training curves.

Figures are built as `matplotlib.figure.Figure` objects and saved with the Agg renderer, so the
module works headless and importing it never changes pyplot's global backend. Every plot says
what it shows: titles, axis labels, a labelled colorbar, a legend.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence

import keras
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

# Heatmap sizing: a cell is between these sizes (inches); the panels together stay within
# MAX_WIDTH x MAX_HEIGHT inches, and tick labels are sized to their cell.
_CELL_MIN, _CELL_MAX = 0.1, 0.35
_MAX_WIDTH, _MAX_HEIGHT = 14.0, 10.0
_POINTS_PER_INCH = 72.0


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


def _check_length(name: str, values, expected: int, shape) -> None:
    if values is not None and len(values) != expected:
        raise ValueError(
            f"Argument `{name}` must have {expected} entries to match `matrices`. "
            f"Received: len({name})={len(values)}, matrices.shape={shape}"
        )


def _edges(name: str, values, expected: int, shape) -> np.ndarray:
    """Cell edges around sorted numeric positions: midpoints, and half a gap at both ends."""
    _check_length(name, values, expected, shape)
    centers = _to_numpy(name, values).reshape(-1)
    if np.any(np.diff(centers) <= 0) or not np.all(np.isfinite(centers)):
        raise ValueError(
            f"Argument `{name}` must be finite and strictly increasing (positions of the "
            f"cells). Received: {name}={centers.tolist()}"
        )
    if len(centers) == 1:
        return np.array([centers[0] - 0.5, centers[0] + 0.5])
    middle = (centers[1:] + centers[:-1]) / 2
    return np.concatenate([[2 * centers[0] - middle[0]], middle,
                           [2 * centers[-1] - middle[-1]]])


def _wrap(text: str, width_inches: float, fontsize: float) -> str:
    """Wraps each line of `text` to the characters that fit `width_inches` at `fontsize`."""
    chars = max(20, int(width_inches * _POINTS_PER_INCH / (0.5 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def show_heatmaps(
    matrices,
    xlabel: str,
    ylabel: str,
    titles: Sequence[str] | None = None,
    path: str = "heatmaps.png",
    figsize: tuple[float, float] | None = None,
    cmap: str = "Reds",
    xticklabels: Sequence[str] | None = None,
    yticklabels: Sequence[str] | None = None,
    suptitle: str | None = None,
    row_titles: Sequence[str] | None = None,
    colorbar_label: str = "attention weight",
    vmin: float | None = None,
    vmax: float | None = None,
    xvalues=None,
    yvalues=None,
) -> str:
    """Draws a grid of attention-weight heatmaps with one shared, labelled colorbar.

    All panels share one colour scale, so the colorbar is true for every panel; pass the same
    `vmin` and `vmax` to figures that are meant to be compared with each other. The axis labels
    appear once for the whole grid, and tick labels are sized to their cells, so 1 to 8 panels
    side by side stay readable.

    Args:
        matrices: array or tensor `(num_rows, num_cols, num_queries, num_keys)`, e.g.
            `(num_layers, num_heads, T, S)` attention weights.
        xlabel: str, label of the key axis (once, under the grid).
        ylabel: str, label of the query axis (once, left of the grid).
        titles: list of `num_cols` column titles, shown above the top row. Defaults to `None`.
        path: str, PNG file to write. Defaults to `"heatmaps.png"`.
        figsize: `(width, height)` of the whole figure in inches. Defaults to `None`: sized
            from the number of cells (at most 14 x 10 inches of panels).
        cmap: str, matplotlib colormap. Defaults to `"Reds"`.
        xticklabels: list of `num_keys` key tokens, used for every panel. Defaults to `None`.
        yticklabels: list of `num_queries` query tokens, used for every panel. Defaults to `None`.
        suptitle: str, what the figure shows (e.g. the input and the prediction), above the
            grid; wrapped to the figure's width. Defaults to `None`.
        row_titles: list of `num_rows` row names (e.g. `"layer 1"`), left of each row.
            Defaults to `None`.
        colorbar_label: str, label of the colorbar. Defaults to `"attention weight"`.
        vmin: float, value at the bottom of the colour scale. Defaults to `None`: 0 when no
            entry is negative (attention weights: near-uniform weights then look uniform instead
            of being stretched over the colormap), else the smallest entry.
        vmax: float, value at the top of the colour scale. Defaults to `None` (the largest
            entry). Entries outside `[vmin, vmax]` get the end colours and the colorbar shows an
            arrow at that end, so the clipping is visible.
        xvalues: optional `num_keys` strictly increasing numbers, the positions of the keys
            (e.g. the training inputs `x_i` of kernel regression): the x axis is then numeric
            in these units instead of one cell per index. Defaults to `None`.
        yvalues: optional `num_queries` positions of the queries, as `xvalues`.
            Defaults to `None`.

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
    shape = matrices.shape
    for name, labels, expected in (
        ("titles", titles, num_cols),
        ("row_titles", row_titles, num_rows),
        ("xticklabels", xticklabels, num_keys),
        ("yticklabels", yticklabels, num_queries),
    ):
        _check_length(name, labels, expected, shape)
    x_edges = None if xvalues is None else _edges("xvalues", xvalues, num_keys, shape)
    y_edges = None if yvalues is None else _edges("yvalues", yvalues, num_queries, shape)
    smallest = float(np.nanmin(matrices))
    low = min(0.0, smallest) if vmin is None else float(vmin)
    high = float(np.nanmax(matrices)) if vmax is None else float(vmax)
    if not high > low:
        if vmin is not None or vmax is not None:
            raise ValueError(
                "Arguments `vmin` and `vmax` must satisfy vmin < vmax. "
                f"Received: vmin={vmin!r}, vmax={vmax!r} (data range {np.nanmin(matrices)} to "
                f"{np.nanmax(matrices)})"
            )
        high = low + 1.0  # constant matrices: any scale shows them
    extend = {(False, False): "neither", (True, False): "min", (False, True): "max",
              (True, True): "both"}[(bool(np.nanmin(matrices) < low),
                                     bool(np.nanmax(matrices) > high))]

    # Cell size in inches: as large as fits, within [_CELL_MIN, _CELL_MAX]; tick labels are
    # sized to their cell, and the figure leaves room for every text around the panels.
    if figsize is None:
        cell = min(_CELL_MAX, _MAX_WIDTH / (num_cols * num_keys),
                   _MAX_HEIGHT / (num_rows * num_queries))
        cell = max(cell, _CELL_MIN)
    else:
        cell = min((figsize[0] - 2.0) / (num_cols * num_keys),
                   (figsize[1] - 1.5) / (num_rows * num_queries))
        cell = max(cell, 0.03)
    tick_size = float(np.clip(0.75 * cell * _POINTS_PER_INCH, 4.0, 10.0))
    if figsize is None:
        def text_inches(labels, size):  # the longest label, written along its length
            longest = max((len(str(label)) for label in labels or ()), default=2)
            return longest * 0.62 * size / _POINTS_PER_INCH

        width = num_cols * num_keys * cell + text_inches(yticklabels, tick_size) + 2.0
        suptitle_lines = 0
        if suptitle:
            suptitle_lines = _wrap(suptitle, width, 11).count("\n") + 1
        height = (num_rows * num_queries * cell + text_inches(xticklabels, tick_size)
                  + suptitle_lines * 1.5 * 11 / _POINTS_PER_INCH + 1.2)
        figsize = (width, height)
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(num_rows, num_cols, sharex=True, sharey=True, squeeze=False)
    for i in range(num_rows):
        for j in range(num_cols):
            ax = axes[i, j]
            if x_edges is None and y_edges is None:
                image = ax.imshow(matrices[i, j], cmap=cmap, vmin=low, vmax=high)
            else:
                xs = np.arange(num_keys + 1) - 0.5 if x_edges is None else x_edges
                ys = np.arange(num_queries + 1) - 0.5 if y_edges is None else y_edges
                image = ax.pcolormesh(xs, ys, matrices[i, j], cmap=cmap, vmin=low, vmax=high)
                ax.set_xlim(xs[0], xs[-1])
                ax.set_ylim(ys[-1], ys[0])  # queries downwards, as imshow draws them
                ax.set_box_aspect(num_queries / num_keys)
            if titles is not None and i == 0:
                ax.set_title(titles[j], fontsize=10)
            if row_titles is not None and j == 0:
                ax.set_ylabel(row_titles[i], fontsize=10)
            if xticklabels is not None:
                ax.set_xticks(range(num_keys), labels=list(xticklabels), rotation=90,
                              fontsize=tick_size)
            if yticklabels is not None:
                ax.set_yticks(range(num_queries), labels=list(yticklabels), fontsize=tick_size)
    if num_cols == 1 and num_rows == 1 and row_titles is None:
        axes[0, 0].set_xlabel(xlabel)
        axes[0, 0].set_ylabel(ylabel)
    else:
        fig.supxlabel(xlabel, fontsize=10)
        fig.supylabel(ylabel, fontsize=10)
    colorbar = fig.colorbar(image, ax=axes, shrink=0.8 if num_rows > 1 else 1.0,
                            extend=extend, aspect=max(10, 20 * min(num_rows, 2)))
    colorbar.set_label(colorbar_label)
    if suptitle:
        fig.suptitle(_wrap(suptitle, figsize[0], 11), fontsize=11)
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

    The axes cover every point drawn; the legend names the three series.

    Args:
        x_test: array `(n_test,)` of test inputs.
        y_truth: array `(n_test,)`, true function values.
        y_hat: array `(n_test,)`, predictions.
        x_train: array `(n_train,)` of training inputs.
        y_train: array `(n_train,)` of noisy training targets.
        path: str, PNG file to write. Defaults to `"kernel_regression.png"`.
        title: str, figure title, e.g. the method and its test MSE. Defaults to `None`.

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
    fig = Figure(figsize=(4.5, 3.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(x_train, y_train, "o", color="tab:green", alpha=0.5, markersize=4,
            label="training data (noisy)")
    ax.plot(x_test, y_truth, color="tab:blue", label="true function")
    ax.plot(x_test, y_hat, color="tab:orange", linestyle="--", label="prediction")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(_wrap(title, 4.5, 10), fontsize=10)
    return _save(fig, path)


def plot_history(
    history,
    path: str = "history.png",
    metrics: Sequence[str] | None = None,
    title: str | None = None,
) -> str:
    """Plots training curves, one panel per metric, with its `val_` curve when present.

    Epochs are numbered from 1 on an integer axis; each panel names its metric on the y axis
    and tells the training curve from the validation curve in its legend.

    Args:
        history: a `keras.callbacks.History` (what `model.fit` returns) or a dict of lists,
            e.g. `{"loss": [...], "val_loss": [...]}`.
        path: str, PNG file to write. Defaults to `"history.png"`.
        metrics: list of metric names to plot. Defaults to `None` (every key not starting
            with `val_`).
        title: str, title of the whole figure. Defaults to `None`.

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
    fig = Figure(figsize=(3.8 * len(metrics), 3.0), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, name in zip(axes, metrics):
        values = np.asarray(logs[name], dtype=np.float64)
        ax.plot(np.arange(1, len(values) + 1), values, marker="o", markersize=3,
                label="training")
        if f"val_{name}" in logs:
            val = np.asarray(logs[f"val_{name}"], dtype=np.float64)
            ax.plot(np.arange(1, len(val) + 1), val, marker="o", markersize=3,
                    linestyle="--", label="validation")
        num_epochs = max(len(values), len(logs.get(f"val_{name}", ())))
        ax.set_xlim(0.5, num_epochs + 0.5)  # epochs 1 to n, no epoch 0
        if num_epochs <= 10:  # every epoch gets its tick (a locator would show 0.95 ... 1.05)
            ax.set_xticks(range(1, num_epochs + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.set_title(name.replace("_", " "))
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, path)
