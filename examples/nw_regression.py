"""Nadaraya–Watson kernel regression: attention pooling from the ground up.

Fits the seeds' toy data (y = 2 sin x + x^0.8 + noise) three ways and scores each against the
true function on x = 0, 0.1, ..., 4.9:

1. average pooling: f(x) = mean(y_i), ignores the query;
2. nonparametric NW pooling: f(x) = Σ softmax(-½(x - x_i)²) y_i;
3. parametric NW pooling: the same with a learnable width w, trained with SGD where each
   training point is a query over all *other* training points (leave-one-out mask).

Writes into OUT: metrics.json, the three fit plots (fit_<method>.png, test MSE in the title),
the attention weights of both NW poolings on one shared colour scale
(attention_<method>.png: test inputs x against training inputs x_i) and the training loss
(history.png).

    python examples/nw_regression.py --out runs/nw

An OUT that holds an earlier run's metrics.json is refused unless --overwrite is given.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import TYPE_CHECKING

from example_utils import (
    check_run_dirs,
    import_tensorflow_quietly,
    positive,
)

if TYPE_CHECKING:
    import keras


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example:\n  python examples/nw_regression.py --out runs/nw",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=50,
                        help="SGD epochs for parametric NW (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=50,
                        help="training queries per SGD step; 50 = the whole training set "
                             "(default: %(default)s)")
    parser.add_argument("--learning-rate", type=positive, default=0.5,
                        help="SGD learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--out", default="runs/nw_regression",
                        help="output directory (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier run in OUT (default: refuse)")
    args = parser.parse_args(argv)
    problem = check_run_dirs(args.out, None, args.overwrite)
    if problem:
        parser.error(problem)
    return args


def build_parametric_model(num_train: int) -> keras.Model:
    """query (1,) attends over keys (n,) and values (n,), with a (1, n) mask."""
    import keras

    from keras_attn.layers import NWPooling

    query = keras.Input((1,), name="query")
    keys = keras.Input((num_train,), name="keys")
    values = keras.Input((num_train,), name="values")
    mask = keras.Input((1, num_train), dtype="bool", name="mask")
    pooled = NWPooling(learnable=True, name="nw")(query, keys, values, attention_mask=mask)
    return keras.Model([query, keys, values, mask], pooled)


def main(argv=None) -> dict:
    args = parse_args(argv)  # before TensorFlow is imported: --help and refusals are quick
    import_tensorflow_quietly()
    import keras
    import numpy as np

    from keras_attn.data.nw import make_kernel_regression_data
    from keras_attn.layers import NWPooling
    from keras_attn.recipes.runtime import fit_verbosity
    from keras_attn.viz import plot_history, plot_kernel_reg, show_heatmaps

    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    data = make_kernel_regression_data(seed=args.seed)
    n, n_test = len(data.x_train), len(data.x_test)
    x_test, x_train, y_train = data.x_test[None], data.x_train[None], data.y_train[None]

    def mse(y_hat) -> float:
        return float(np.mean((np.asarray(y_hat).reshape(-1) - data.y_truth) ** 2))

    # 1. Average pooling.
    y_avg = np.full(n_test, data.y_train.mean(), "float32")

    # 2. Nonparametric NW pooling (w = 1, no weights).
    y_np, w_np = NWPooling()(x_test, x_train, y_train, return_attention_scores=True)

    # 3. Parametric NW pooling, trained leave-one-out.
    model = build_parametric_model(n)
    model.compile(optimizer=keras.optimizers.SGD(args.learning_rate), loss="mse")
    train_inputs = [
        data.x_train[:, None],  # (n, 1) one query per example
        np.tile(data.x_train, (n, 1)),  # (n, n) keys
        np.tile(data.y_train, (n, 1)),  # (n, n) values
        ~np.eye(n, dtype=bool)[:, None, :],  # (n, 1, n) leave its own pair out
    ]
    start = time.perf_counter()
    history = model.fit(train_inputs, data.y_train[:, None], epochs=args.epochs,
                        batch_size=args.batch_size, shuffle=True, verbose=fit_verbosity())
    train_seconds = time.perf_counter() - start
    nw_layer = model.get_layer("nw")
    y_param, w_param = nw_layer(x_test, x_train, y_train, return_attention_scores=True)

    metrics = {
        "test_mse": {
            "average_pooling": mse(y_avg),
            "nonparametric_nw": mse(y_np),
            "parametric_nw": mse(y_param),
        },
        "learned_width": float(keras.ops.convert_to_numpy(nw_layer.width)),
        "final_train_loss": float(history.history["loss"][-1]),
        "train_seconds": train_seconds,
    }
    width = metrics["learned_width"]
    labels = {
        "average_pooling": "average pooling: f(x) = mean(y_i)",
        "nonparametric_nw": "nonparametric NW pooling (w = 1)",
        "parametric_nw": f"parametric NW pooling (learned w = {width:.2f})",
    }
    for name, y_hat in (("average_pooling", y_avg), ("nonparametric_nw", y_np),
                        ("parametric_nw", y_param)):
        plot_kernel_reg(data.x_test, data.y_truth, np.asarray(y_hat).reshape(-1),
                        data.x_train, data.y_train,
                        path=os.path.join(args.out, f"fit_{name}.png"),
                        title=f"{labels[name]}\ntest MSE {metrics['test_mse'][name]:.4f}")
    # One colour scale for both maps, so that they can be compared with each other.
    maps = {"nonparametric_nw": np.asarray(w_np), "parametric_nw": np.asarray(w_param)}
    top = max(float(weights.max()) for weights in maps.values())
    for name, weights in maps.items():
        show_heatmaps(weights.reshape((1, 1) + weights.shape[-2:]), xlabel="training inputs x_i (keys)",
                      ylabel="test inputs x (queries)",
                      suptitle=labels[name],
                      path=os.path.join(args.out, f"attention_{name}.png"), figsize=(5, 4.5),
                      vmin=0.0, vmax=top, xvalues=data.x_train, yvalues=data.x_test)
    plot_history(history, path=os.path.join(args.out, "history.png"),
                 title="parametric NW: leave-one-out training loss (MSE)")
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)

    print("test MSE against the true function:")
    for name, value in metrics["test_mse"].items():
        print(f"  {name:18s} {value:.4f}")
    print(f"learned width w = {metrics['learned_width']:.3f}; outputs in {args.out}/")
    return metrics


if __name__ == "__main__":
    main()
