"""Toy data for Nadaraya-Watson kernel regression (d2l 11.2).

The target is f(x) = 2 sin(x) + x^0.8. Training inputs are sorted draws from 5 * U(0, 1), the
training targets carry Gaussian noise, and the test grid is x = 0, 0.1, ..., 4.9 with the
noise-free truth.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class KernelRegressionData(NamedTuple):
    """Arrays of the kernel regression task, all float32.

    Attributes:
        x_train: `(n_train,)`, sorted training inputs in [0, 5).
        y_train: `(n_train,)`, `true_function(x_train)` plus N(0, noise^2) noise.
        x_test: `(50,)`, the grid 0, 0.1, ..., 4.9.
        y_truth: `(50,)`, `true_function(x_test)` without noise.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_truth: np.ndarray


def true_function(x) -> np.ndarray:
    """The regression target f(x) = 2 sin(x) + x^0.8.

    Args:
        x: array-like of non-negative numbers, any shape.

    Returns:
        float32 array of the same shape as `x`.
    """
    x = np.asarray(x, dtype=np.float64)
    return (2.0 * np.sin(x) + x**0.8).astype(np.float32)


def make_kernel_regression_data(
    n_train: int = 50, seed: int = 0, noise: float = 0.5
) -> KernelRegressionData:
    """Draws the d2l kernel regression data set, reproducibly from `seed`.

    Args:
        n_train: int, number of training points. Defaults to `50`.
        seed: int, seed of `np.random.default_rng`. Defaults to `0`.
        noise: float, standard deviation of the Gaussian noise on `y_train`. Defaults to `0.5`.

    Returns:
        A `KernelRegressionData` with `x_train`, `y_train` of shape `(n_train,)` and `x_test`,
        `y_truth` of shape `(50,)`, all float32.

    Example:
    >>> data = make_kernel_regression_data(seed=0)
    >>> data.x_train.shape, data.x_test.shape
    ((50,), (50,))
    """
    if not isinstance(n_train, (int, np.integer)) or n_train <= 0:
        raise ValueError(
            "Received an invalid value for argument `n_train`, expected a positive integer. "
            f"Received: n_train={n_train!r}"
        )
    if noise < 0:
        raise ValueError(
            "Received an invalid value for argument `noise`, expected a non-negative number. "
            f"Received: noise={noise!r}"
        )
    rng = np.random.default_rng(seed)
    x_train = np.sort(5.0 * rng.uniform(size=n_train)).astype(np.float32)
    y_train = true_function(x_train) + rng.normal(0.0, noise, size=n_train).astype(
        np.float32
    )
    x_test = (np.arange(50) * 0.1).astype(np.float32)
    return KernelRegressionData(
        x_train=x_train,
        y_train=y_train.astype(np.float32),
        x_test=x_test,
        y_truth=true_function(x_test),
    )
