"""Pieces every softmax-attention kernel shares: scores, masking, row terms, reductions."""

from __future__ import annotations

from keras import ops

from keras_attn import tuning
from keras_attn.ops.masks import MASK_VALUE

# Log-sum-exp given to rows with nothing to attend to: every weight recomputed from it is
# exp(-1e30 - 1e30) = 0, so such a row's gradient is exactly zero.
EMPTY_ROW_LSE = 1e30


def score_operands(q, k):
    """`q` and `k` as the score product takes them: float16 goes to float32, so that inputs
    in the hundreds cannot overflow the scores; bfloat16 (float32's range) stays."""
    if ops.dtype(q) == "float16" or ops.dtype(k) == "float16":
        return ops.cast(q, "float32"), ops.cast(k, "float32")
    return q, k


def scores(q, k, tile=None, bias=None):
    """Float32 `q kᵀ (+ bias)`, `(..., r, c)`, with entries hidden by the boolean `tile` at
    -1e30. `q` is already scaled."""
    q, k = score_operands(q, k)
    out = ops.cast(tuning.matmul(q, ops.swapaxes(k, -1, -2)), "float32")  # (..., r, c)
    if bias is not None:
        out = out + ops.cast(bias, "float32")
    if tile is not None:
        out = ops.where(tile, out, MASK_VALUE)
    return out


def append_column(x, value):
    """`(..., n, m)` -> `(..., n, m + 1)` with `value` (broadcast) as the last column."""
    column = ops.broadcast_to(ops.cast(value, x.dtype), tuple(ops.shape(x)[:-1]) + (1,))
    return ops.concatenate([x, column], axis=-1)


def matmul_minus_rows(a, b, rows, fold: bool):
    """Float32 `a bᵀ - rows` for `a` `(..., r, m)`, `b` `(..., c, m)`, `rows` `(..., r, 1)`;
    with `fold`, as one product `[a, -rows] [b, 1]ᵀ` (`keras_attn.tuning.fold_row_terms`)."""
    if fold:
        product = tuning.matmul(append_column(a, -rows), ops.swapaxes(append_column(b, 1.0),
                                                                        -1, -2))
        return ops.cast(product, "float32")
    a, b = score_operands(a, b)
    return ops.cast(tuning.matmul(a, ops.swapaxes(b, -1, -2)), "float32") - rows


def sum_to_shape(x, shape):
    """Sum `x` over the axes along which a tensor of `shape` was broadcast to `x`'s shape
    (leading axes it lacks, and axes where it has size 1)."""
    shape = tuple(shape)
    extra = len(x.shape) - len(shape)
    if extra:
        x = ops.sum(x, axis=tuple(range(extra)))
    axes = tuple(i for i, dim in enumerate(shape) if dim == 1 and x.shape[i] != 1)
    if axes:
        x = ops.sum(x, axis=axes, keepdims=True)
    return x


def rows_with_keys(tile):
    """`(..., r, 1)` True where a row of the boolean `tile` sees any key; None for no tile."""
    return None if tile is None else ops.any(tile, axis=-1, keepdims=True)
