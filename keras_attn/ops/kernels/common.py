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


def product(q, k):
    """Float32 `q kᵀ`, `(..., r, c)`, of already scaled queries."""
    q, k = score_operands(q, k)
    return ops.cast(tuning.matmul(q, ops.swapaxes(k, -1, -2)), "float32")  # (..., r, c)


def soft_capped(raw, soft_cap):
    """`(soft_cap · tanh(raw / soft_cap), 1 - tanh²)`: Gemma's capped scores and their
    derivative with respect to `raw` (float32, `(..., r, c)`)."""
    t = ops.tanh(raw / soft_cap)
    return soft_cap * t, 1.0 - t * t


def biased_and_masked(s, tile=None, bias=None):
    """Float32 scores `s` plus `bias`, with entries hidden by the boolean `tile` at -1e30."""
    if bias is not None:
        s = s + ops.cast(bias, "float32")
    if tile is not None:
        s = ops.where(tile, s, MASK_VALUE)
    return s


def scores(q, k, tile=None, bias=None, soft_cap=None):
    """Float32 `q kᵀ` (soft-capped by `soft_cap`, then `+ bias`), `(..., r, c)`, with entries
    hidden by the boolean `tile` at -1e30. `q` is already scaled."""
    out = product(q, k)  # (..., r, c)
    if soft_cap is not None:
        out = soft_capped(out, soft_cap)[0]
    return biased_and_masked(out, tile, bias)


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


def lead_shape(q, k) -> tuple:
    """The leading axes of the scores: `q`'s and `k`'s broadcast against each other."""
    q_dims, k_dims = ops.shape(q)[:-2], ops.shape(k)[:-2]
    return tuple(k_dim if q.shape[i] == 1 else q_dim
                 for i, (q_dim, k_dim) in enumerate(zip(q_dims, k_dims)))


def lay_out(tile, lead):
    """A `(H, r, c)` position-bias tile laid out over the leading axes `lead` `(B, ...)` of the
    scores: `(1, ..., r, c)`, the heads spread over `lead[1:]` (one axis, or key/value heads
    and their groups)."""
    shape = ops.shape(tile)
    return ops.reshape(tile, (1,) + tuple(lead[1:]) + tuple(shape[-2:]))


def lay_in(d_tile, num_heads):
    """The inverse of `lay_out` for a gradient summed over the batch: `(..., r, c)` ->
    `(H, r, c)`."""
    shape = ops.shape(d_tile)
    return ops.reshape(d_tile, (num_heads,) + tuple(shape[-2:]))
