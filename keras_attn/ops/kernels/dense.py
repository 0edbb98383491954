"""The dense kernel: the `(..., T, S)` weights formed in one piece.

`dense_attention` computes `softmax(q kᵀ + bias) v` over every key at once. With
`return_weights=True` it returns the weights and is differentiated by the backend (every
operation on the `(T, S)` matrix has its own gradient). With `return_weights=False` it keeps
the weights for a backward pass of its own (FlashAttention's, Dao et al., 2022):

    dV = Pᵀ dO,   dS = P ⊙ (dO Vᵀ - δ),   δ = rowsum(dO ⊙ O),   dQ = dS K,   dK = dSᵀ Q,

which passes over the `(T, S)` matrix fewer times than differentiating the softmax
(`rowsum(dP ⊙ P)` reads two `(T, S)` tensors; `δ` reads two `(T, dv)` ones). With dropout,
`O = D V` for the dropped weights `D = M ⊙ P · s`, `dP = M ⊙ (dO Vᵀ) · s`, and since
`rowsum(dP ⊙ P) = rowsum(dO ⊙ O)` still, `dS = P ⊙ (dP - δ)`; the mask `M` is read back from
`D` (where `D` is 0 the weight was dropped or `P` is 0, and `P ⊙ dP` is 0 either way).
Both forms give the same forward numbers.

Inputs are scaled queries `(..., T, d)`, keys `(..., S, d)` and values `(..., S, dv)` whose
leading axes broadcast against each other (a key/value head shared by a group of query heads).
"""

from __future__ import annotations

from keras import ops

from keras_attn import tuning
from keras_attn.ops.dropout import dropout, dropout_scale
from keras_attn.ops.kernels.common import (
    biased_and_masked,
    matmul_minus_rows,
    product,
    rows_with_keys,
    soft_capped,
    sum_to_shape,
)
from keras_attn.ops.softmax import softmax


def _weights(q, k, tile, bias, soft_cap=None):
    """Float32 weights `(..., T, S)`, the rows that see a key (or None), and, with `soft_cap`,
    the capped scores' derivative `1 - tanh²` (else None). Rows that see no key softmax to
    uniform here, and the caller zeroes them (their `has_keys` is False)."""
    s, slope = product(q, k), None  # (..., T, S)
    if soft_cap is not None:
        s, slope = soft_capped(s, soft_cap)
    s = biased_and_masked(s, tile, bias)
    return softmax(s, axis=-1), rows_with_keys(tile), slope


def dense_attention(q, k, v, tile=None, bias=None, dropout_rate: float = 0.0, seed=None,
                    return_weights: bool = True, soft_cap: float | None = None):
    """`softmax(q kᵀ + bias) v` with the weights in one piece.

    Args:
        q: scaled queries `(..., T, d)`.
        k: keys `(..., S, d)`.
        v: values `(..., S, dv)`.
        tile: optional boolean mask broadcastable to `(..., T, S)`, True = attend (an
            `AttentionMask.block()`).
        bias: optional float bias broadcastable to `(..., T, S)`, added to the scores.
        dropout_rate: float in [0, 1), dropout on the weights (0 outside training).
        seed: the dropout's seed (int or `keras.random.SeedGenerator`).
        return_weights: bool: return the weights and let the backend differentiate, or keep
            them for the fused backward pass and return None.
        soft_cap: optional float `c`: the scores become `c · tanh(q kᵀ / c)` before the bias
            and the mask. Defaults to `None`.

    Returns:
        `(outputs, weights)`: `(..., T, dv)` in the dtype of `v`, and the float32-computed
        weights `(..., T, S)` in the dtype of `v` (None with `return_weights=False`). Rows with
        nothing to attend to have zero weights and outputs.
    """
    if return_weights:
        weights, has_keys, _ = _weights(q, k, tile, bias, soft_cap)
        if has_keys is not None:
            weights = ops.where(has_keys, weights, 0.0)
        weights = ops.cast(weights, v.dtype)
        attended = dropout(weights, dropout_rate, seed=seed) if dropout_rate > 0.0 else weights
        return tuning.matmul(attended, v), weights  # (..., T, dv)
    extras = () if bias is None else (bias,)
    return _fused(tile, dropout_rate, seed, soft_cap)(q, k, v, *extras), None


def _forward_backward(q, k, v, tile, bias, dropout_rate, seed, soft_cap=None):
    """The fused forward pass; returns the outputs and the function of the upstream gradient
    that gives `(dq, dk, dv, d_scores)` (`d_scores` with respect to the biased scores)."""
    weights, has_keys, slope = _weights(q, k, tile, bias, soft_cap)  # float32 (..., T, S)
    attended = ops.cast(weights, v.dtype)  # P, or D after dropout
    if dropout_rate > 0.0:
        attended = dropout(attended, dropout_rate, seed=seed)
    outputs = tuning.matmul(attended, v)  # (..., T, dv)
    if has_keys is not None:
        # A row that sees no key softmaxed to uniform over -1e30: zero its output here and its
        # upstream gradient below instead of touching the (T, S) weights.
        outputs = ops.where(has_keys, outputs, ops.zeros_like(outputs))

    def backward(upstream):
        d_out = ops.cast(upstream, v.dtype)
        if has_keys is not None:
            d_out = ops.where(has_keys, d_out, ops.zeros_like(d_out))
        delta = ops.sum(ops.cast(d_out, "float32") * ops.cast(outputs, "float32"), axis=-1,
                        keepdims=True)  # (..., T, 1): rowsum(dO ⊙ O)
        d_v = tuning.matmul_transposed(attended, d_out)  # (..., S, dv)
        if dropout_rate > 0.0:
            d_attended = ops.cast(tuning.matmul(d_out, ops.swapaxes(v, -1, -2)), "float32")
            # s as dropout applied it (rounded to the value dtype).
            scale = ops.cast(ops.cast(dropout_scale(dropout_rate), v.dtype), "float32")
            d_probs = ops.where(attended != 0, d_attended * scale, 0.0)
            d_scores = weights * (d_probs - delta)  # (..., T, S)
        else:
            fold = tuning.fold_row_terms(q, v) and not tuning.exceeds_block_budget(weights)
            d_scores = weights * matmul_minus_rows(d_out, v, delta, fold)  # (..., T, S)
        # Through the soft cap: d raw = d capped · (1 - tanh²).
        d_scores_q = ops.cast(d_scores if slope is None else d_scores * slope, q.dtype)
        d_q = tuning.matmul(d_scores_q, ops.cast(k, q.dtype))  # (..., T, d)
        d_k = tuning.matmul_transposed(d_scores_q, q)  # (..., S, d)
        return (ops.cast(d_q, q.dtype), ops.cast(sum_to_shape(d_k, k.shape), k.dtype),
                ops.cast(sum_to_shape(d_v, v.shape), v.dtype), d_scores)

    return outputs, backward


def _fused(tile, dropout_rate, seed, soft_cap=None):
    @ops.custom_gradient
    def attend(q, k, v, *bias):
        outputs, backward = _forward_backward(q, k, v, tile, bias[0] if bias else None,
                                              dropout_rate, seed, soft_cap)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            d_q, d_k, d_v, d_scores = backward(upstream)
            if not bias:
                return d_q, d_k, d_v
            return d_q, d_k, d_v, ops.cast(sum_to_shape(d_scores, bias[0].shape), bias[0].dtype)

        return outputs, grad

    return attend
