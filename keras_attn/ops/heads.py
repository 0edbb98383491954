"""Splitting a projection into attention heads and merging them back."""

from __future__ import annotations

from keras import ops

from keras_attn.tuning import xla_barrier


def split_heads(x, num_heads: int):
    """`(B, T, H · d)` -> `(B, H, T, d)`.

    Under XLA the transpose stays an op of its own (`keras_attn.tuning.xla_barrier`).
    """
    shape = ops.shape(x)
    x = ops.reshape(xla_barrier(x), tuple(shape[:-1]) + (num_heads, shape[-1] // num_heads))
    return xla_barrier(ops.transpose(x, (0, 2, 1, 3)))  # (B, H, T, d)


def merge_heads(x):
    """`(B, H, T, d)` -> `(B, T, H · d)`."""
    x = ops.transpose(x, (0, 2, 1, 3))  # (B, T, H, d)
    shape = ops.shape(x)
    return xla_barrier(ops.reshape(x, tuple(shape[:2]) + (shape[2] * shape[3],)))
