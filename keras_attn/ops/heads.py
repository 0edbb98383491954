"""Splitting a projection into attention heads and merging them back."""

from __future__ import annotations

from keras import ops

from keras_attn.tuning import xla_barrier


def reshape_keeping_batch(x, trailing: tuple):
    """`x` `(B, T, ...)` reshaped to `(B, T, *trailing)`, written `(B, -1, *trailing)`.

    tf2onnx (1.17, Keras' ONNX export on TensorFlow) rewrites `reshape(y, (B, T, ...))` of a
    `Dense` output `y` as ONNX's "copy this dimension" (0) and then folds it into the `Dense`'s
    own `(B · T, n) -> (B, T, n)` reshape: the exported model reshapes `(B · T, n)` to `(B · T,
    n, ...)` and fails. With -1 for `T` it keeps the shape as computed (`B` must be non-zero).
    """
    return ops.reshape(x, (ops.shape(x)[0], -1) + tuple(trailing))


def split_heads(x, num_heads: int):
    """`(B, T, H · d)` -> `(B, H, T, d)`.

    Under XLA the transpose stays an op of its own (`keras_attn.tuning.xla_barrier`). The
    sequence axis is given as -1 (`reshape_keeping_batch`): the shape ONNX exports convert to.
    """
    shape = ops.shape(x)
    x = reshape_keeping_batch(xla_barrier(x), (num_heads, shape[-1] // num_heads))
    return xla_barrier(ops.transpose(x, (0, 2, 1, 3)))  # (B, H, T, d)


def merge_heads(x):
    """`(B, H, T, d)` -> `(B, T, H · d)`."""
    x = ops.transpose(x, (0, 2, 1, 3))  # (B, T, H, d)
    shape = ops.shape(x)
    return xla_barrier(reshape_keeping_batch(x, (shape[2] * shape[3],)))
