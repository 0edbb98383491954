"""The blockwise kernel: exact attention over blocks of keys with an online softmax.

`blockwise_attention` computes exactly `softmax(q kᵀ + bias) v` without ever holding the
`(T, S)` scores or weights. Keys (and optionally queries) are visited in blocks; each query row
keeps a running maximum `m`, a running sum `l` and a running weighted sum of values, rescaled
whenever the maximum grows (Milakov & Gimelshein, 2018; Rabe & Staats, 2021). Peak memory grows
with `T · chunk_size` instead of `T · S`.

The gradient is FlashAttention's (Dao et al., 2022): the forward pass keeps the output and the
per-row log-sum-exp `L = m + log l`; the backward pass recomputes each block's weights
`P = exp(q kⱼᵀ - L)` and accumulates `dVⱼ = Pᵀ dO`, `dS = P ⊙ (dO Vⱼᵀ - δ)` with
`δ = rowsum(dO ⊙ O)`, `dQ += dS Kⱼ`, `dKⱼ = dSᵀ Q`. Nothing of size `T · S` is stored.

Masks come as an `AttentionMask` and are built one tile at a time; key blocks that no query of a
block can see (above a causal diagonal, past the longest sequence, outside a window) are skipped.
When every key fits in one block and queries are not blocked, this is the dense kernel's fused
path. Dropout is not supported here: a block's mask would have to be drawn again identically in
the backward pass, which Keras' seeded random ops cannot do portably.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_attn import tuning
from keras_attn.ops.kernels.common import (
    EMPTY_ROW_LSE,
    append_column,
    lay_in,
    lay_out,
    lead_shape,
    matmul_minus_rows,
    product,
    scores,
    soft_capped,
    sum_to_shape,
)
from keras_attn.ops.kernels.dense import dense_attention
from keras_attn.ops.masks import MASK_VALUE, AttentionMask


def _static(dim):
    """A static size as a Python int, or None when it is unknown: None in a TensorFlow graph,
    a symbolic size on JAX (Keras infers a user's layer's output with those), which blocks
    cannot be sized from."""
    return int(dim) if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) else None


def _rows(x):
    """The rows (axis -2) of `x`: a Python int when static, else its size as the backend
    reads it at run time."""
    rows = _static(x.shape[-2])
    return rows if rows is not None else ops.shape(x)[-2]


def _static_lead(q, k) -> int:
    """The number of score matrices (sequences times heads) of `q` against `k`: the product of
    their broadcast leading axes, an axis unknown (or symbolic) counted as 1."""
    lead = 1
    for q_dim, k_dim in zip(q.shape[:-2], k.shape[:-2]):
        known = [dim for dim in (_static(q_dim), _static(k_dim)) if dim is not None]
        lead *= max(known) if known else 1
    return lead


def _blocks(length, block: int):
    """Number of blocks of size `block` covering `length` (int or scalar tensor), and padding."""
    num = -(-length // block) if isinstance(length, int) else (length + block - 1) // block
    return num, num * block - length


def _pad(x, axis: int, amount):
    """Pad `amount` entries of zeros at the end of `axis` (axes of size 1 broadcast: kept)."""
    if x is None or x.shape[axis] == 1 or (isinstance(amount, int) and amount == 0):
        return x
    widths = [[0, 0] for _ in x.shape]
    widths[axis % len(x.shape)][1] = amount
    return ops.pad(x, widths)


def _slice(x, axis: int, start, size: int):
    """`x[..., start:start + size, ...]` along `axis`; an axis of size 1 stays whole."""
    axis %= len(x.shape)
    if x.shape[axis] == 1:
        return x
    starts = [0] * len(x.shape)
    starts[axis] = start
    shape = list(ops.shape(x))
    shape[axis] = size
    return ops.slice(x, starts, shape)


class _Blocks:
    """What the forward and backward passes share: block sizes, the mask, the bias."""

    def __init__(self, rank, mask, has_bias, position, offset, lead, chunk, num_key_blocks,
                 q_chunk, num_query_blocks, soft_cap=None):
        self.rank = rank
        self.soft_cap = soft_cap
        self.mask = mask
        self.has_bias = has_bias  # a bias tensor is the first extra input
        self.position = position  # a PositionBias, its parameters the other extra inputs
        self.offset = offset
        self.lead = lead  # the outputs' leading axes, to lay a (H, r, c) bias tile out
        self.chunk = chunk
        self.num_key_blocks = num_key_blocks
        self.q_chunk = q_chunk
        self.num_query_blocks = num_query_blocks

    def key_blocks(self, row_start, rows):
        """`(first, count)`: the key blocks that the queries `[row_start, row_start + rows)`
        can see."""
        if self.mask is None:
            return 0, self.num_key_blocks
        first, end = self.mask.key_range(row_start, rows)
        first_block = first // self.chunk
        count = (end + self.chunk - 1) // self.chunk - first_block
        return first_block, ops.clip(count, 0, self.num_key_blocks)

    def tile(self, row_start, rows, col_start):
        if self.mask is None:
            return None
        return self.mask.block(row_start, rows, col_start, self.chunk, self.rank)

    def positions(self, row_start, rows, col_start):
        """Int32 query positions `(rows, 1)` and key positions `(1, chunk)` of a tile."""
        query_pos = row_start + ops.arange(rows, dtype="int32") + self.offset
        key_pos = col_start + ops.arange(self.chunk, dtype="int32")
        return ops.expand_dims(query_pos, -1), ops.expand_dims(key_pos, 0)

    def bias_tile(self, extras, row_start, rows, col_start):
        """The float32 bias of a tile (tensor slice plus position bias), or None."""
        out = None
        if self.has_bias:
            out = ops.cast(_slice(_slice(extras[0], -2, row_start, rows), -1, col_start,
                                  self.chunk), "float32")
        if self.position is not None:
            params = tuple(extras[int(self.has_bias):])
            tile = self.position.tile(*self.positions(row_start, rows, col_start),
                                      params=params or None)  # (H, rows, c)
            tile = lay_out(tile, self.lead)
            out = tile if out is None else out + tile
        return out

    def key_loop(self, row_start, rows, body, init):
        """Run `body(col_start, carry)` over the visible key blocks."""
        if isinstance(self.num_key_blocks, int) and self.num_key_blocks == 1:
            return body(0, init)
        first, count = self.key_blocks(row_start, rows)
        return tuning.fori_loop(count, lambda j, carry: body((first + j) * self.chunk, carry),
                                init)


def _forward_rows(blocks, q_rows, k, v, extras, row_start):
    """Online softmax over the key blocks for one block of queries: float32 outputs
    `(..., rows, dv)` and log-sum-exp `(..., rows, 1)`."""
    rows = _rows(q_rows)
    value_depth = v.shape[-1]
    # P [V, 1] = [P V, rowsum(P)]: the row sums ride along in the product with the values.
    fold = tuning.fold_row_terms(q_rows, v)
    values = append_column(v, 1.0) if fold else v

    def body(col_start, carry):
        row_max, row_sum, acc = carry
        k_block = _slice(k, -2, col_start, blocks.chunk)  # (..., c, d)
        v_block = _slice(values, -2, col_start, blocks.chunk)  # (..., c, dv [+ 1])
        s = scores(q_rows, k_block, blocks.tile(row_start, rows, col_start),
                   blocks.bias_tile(extras, row_start, rows, col_start),
                   blocks.soft_cap)  # (..., rows, c)
        new_max = ops.maximum(row_max, ops.max(s, axis=-1, keepdims=True))  # (..., rows, 1)
        # Masked entries are exp(-1e30 - max) = 0 once a row has seen a real score; before
        # that they count 1 each, and the rescale exp(-1e30 - max) = 0 wipes them later.
        probs = ops.exp(s - new_max)  # (..., rows, c)
        rescale = ops.exp(row_max - new_max)  # (..., rows, 1)
        context = ops.cast(tuning.matmul(ops.cast(probs, v.dtype), v_block), "float32")
        if fold:
            block_sum, context = context[..., value_depth:], context[..., :value_depth]
        else:
            block_sum = ops.sum(probs, axis=-1, keepdims=True)
        return new_max, rescale * row_sum + block_sum, rescale * acc + context

    lead = lead_shape(q_rows, k) + (rows,)
    init = (ops.full(lead + (1,), MASK_VALUE, "float32"), ops.zeros(lead + (1,), "float32"),
            ops.zeros(lead + (value_depth,), "float32"))
    row_max, row_sum, acc = blocks.key_loop(row_start, rows, body, init)
    if blocks.mask is None:
        return acc / row_sum, row_max + ops.log(row_sum)
    # A row whose running max never left -1e30 had nothing to attend to: zero output, and an
    # lse that makes every recomputed weight of the row 0 in the backward pass.
    has_keys = ops.greater(row_max, 0.5 * MASK_VALUE)  # (..., rows, 1)
    safe_sum = ops.where(has_keys, row_sum, 1.0)
    return (ops.where(has_keys, acc / safe_sum, 0.0),
            ops.where(has_keys, row_max + ops.log(safe_sum), EMPTY_ROW_LSE))


def _backward_rows(blocks, q_rows, k, v, extras, d_out, delta, lse, row_start, carry):
    """Gradients for one block of queries: `(dq_rows, dk, dv, d_extras)`, adding this block's
    share into the key, value, bias and position-parameter gradients of `carry`."""
    rows = _rows(q_rows)
    fold = tuning.fold_row_terms(q_rows, v)
    accumulate = blocks.q_chunk is not None  # other query blocks add to the same keys

    def body(col_start, carry):
        dq_rows, dk, dv, d_extras = carry
        k_block = _slice(k, -2, col_start, blocks.chunk)  # (..., c, d)
        v_block = _slice(v, -2, col_start, blocks.chunk)  # (..., c, dv)
        tile = blocks.tile(row_start, rows, col_start)
        bias_tile = blocks.bias_tile(extras, row_start, rows, col_start)
        # The block's weights, recomputed: exp(q kᵀ + bias - lse) (q kᵀ soft-capped).
        slope = None
        if blocks.soft_cap is None:
            shifted = matmul_minus_rows(q_rows, k_block, lse, fold)  # (..., rows, c)
        else:
            capped, slope = soft_capped(product(q_rows, k_block), blocks.soft_cap)
            shifted = capped - lse
        if bias_tile is not None:
            shifted = shifted + bias_tile
        if tile is not None:
            shifted = ops.where(tile, shifted, MASK_VALUE)
        probs = ops.exp(shifted)  # (..., rows, c)
        d_v = tuning.matmul_transposed(ops.cast(probs, d_out.dtype), d_out)  # (..., c, dv)
        d_scores = probs * matmul_minus_rows(d_out, v_block, delta, fold)  # (..., rows, c)
        # Through the soft cap: d raw = d capped · (1 - tanh²).
        d_scores_q = ops.cast(d_scores if slope is None else d_scores * slope, q_rows.dtype)
        dq_rows = dq_rows + ops.cast(tuning.matmul(d_scores_q, ops.cast(k_block, q_rows.dtype)),
                                     "float32")
        d_k = ops.cast(sum_to_shape(tuning.matmul_transposed(d_scores_q, q_rows), k.shape),
                       "float32")  # (..., c, d)
        d_v = ops.cast(sum_to_shape(d_v, v.shape), "float32")
        starts = [0] * (len(k.shape) - 2) + [col_start, 0]
        if accumulate:
            d_k = d_k + _slice(dk, -2, col_start, blocks.chunk)
            d_v = d_v + _slice(dv, -2, col_start, blocks.chunk)
        dk = ops.slice_update(dk, starts, d_k)
        dv = ops.slice_update(dv, starts, d_v)
        d_extras = list(d_extras)
        if blocks.has_bias:
            block_shape = _slice(_slice(extras[0], -2, row_start, rows), -1, col_start,
                                 blocks.chunk).shape
            d_extras[0] = _add_bias_block(d_extras[0], sum_to_shape(d_scores, block_shape),
                                          extras[0], row_start, col_start)
        if blocks.position is not None and blocks.position.params:
            d_tile = lay_in(ops.sum(d_scores, axis=0), blocks.position.num_heads)  # (H, r, c)
            grads = blocks.position.tile_grads(d_tile, *blocks.positions(row_start, rows,
                                                                          col_start))
            offset = int(blocks.has_bias)
            for i, grad in enumerate(grads):
                d_extras[offset + i] = d_extras[offset + i] + ops.cast(grad, "float32")
        return dq_rows, dk, dv, tuple(d_extras)

    dq_rows = ops.zeros(ops.shape(q_rows), "float32")
    return blocks.key_loop(row_start, rows, body, (dq_rows,) + tuple(carry))


def _add_bias_block(d_bias, block, bias, row_start, col_start):
    """Add a tile's bias gradient into the `d_bias` buffer (broadcast axes accumulate)."""
    rank = len(bias.shape)
    starts = [0] * rank
    if bias.shape[-2] != 1:
        starts[-2] = row_start
    if bias.shape[-1] != 1:
        starts[-1] = col_start
    block = ops.cast(block, "float32")
    current = ops.slice(d_bias, starts, ops.shape(block))
    return ops.slice_update(d_bias, starts, current + block)


def _attention_fn(blocks):
    """The custom-gradient function of (scaled query, padded key, padded value, *extras), the
    extras a bias tensor and then the position bias' parameters."""

    def forward(q, k, v, extras):
        if blocks.q_chunk is None:
            return _forward_rows(blocks, q, k, v, extras, 0)
        lead = lead_shape(q, k) + (_rows(q),)

        def body(i, carry):
            outputs, lse = carry
            row_start = i * blocks.q_chunk
            q_rows = _slice(q, -2, row_start, blocks.q_chunk)  # (..., rq, d)
            out_rows, lse_rows = _forward_rows(blocks, q_rows, k, v, extras, row_start)
            starts = [0] * (len(lead) - 1) + [row_start, 0]
            return (ops.slice_update(outputs, starts, out_rows),
                    ops.slice_update(lse, starts, lse_rows))

        init = (ops.zeros(lead + (v.shape[-1],), "float32"), ops.zeros(lead + (1,), "float32"))
        return tuning.fori_loop(blocks.num_query_blocks, body, init)

    def backward(q, k, v, extras, outputs, lse, upstream):
        d_out = ops.cast(upstream, v.dtype)
        # rowsum(dO ⊙ O): the softmax Jacobian's diagonal correction, one number per row.
        delta = ops.sum(ops.cast(d_out, "float32") * outputs, axis=-1, keepdims=True)
        d_extras = tuple(ops.zeros(ops.shape(x), "float32") for x in extras)
        carry = (ops.zeros(ops.shape(k), "float32"), ops.zeros(ops.shape(v), "float32"),
                 d_extras)
        if blocks.q_chunk is None:
            return _backward_rows(blocks, q, k, v, extras, d_out, delta, lse, 0, carry)

        def body(i, carry):
            dq, dk, dv, d_extras = carry
            row_start = i * blocks.q_chunk
            q_rows, d_rows, delta_rows, lse_rows = (
                _slice(x, -2, row_start, blocks.q_chunk) for x in (q, d_out, delta, lse))
            dq_rows, dk, dv, d_extras = _backward_rows(
                blocks, q_rows, k, v, extras, d_rows, delta_rows, lse_rows, row_start,
                (dk, dv, d_extras))
            starts = [0] * (len(dq.shape) - 2) + [row_start, 0]
            return ops.slice_update(dq, starts, dq_rows), dk, dv, d_extras

        return tuning.fori_loop(blocks.num_query_blocks, body,
                                (ops.zeros(ops.shape(q), "float32"),) + carry)

    @ops.custom_gradient
    def attend(q, k, v, *extras):
        outputs, lse = forward(q, k, v, extras)

        def grad(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            dq, dk, dv, d_extras = backward(q, k, v, extras, outputs, lse, upstream)
            return (ops.cast(dq, q.dtype), ops.cast(dk, k.dtype), ops.cast(dv, v.dtype)) + tuple(
                ops.cast(d, x.dtype) for d, x in zip(d_extras, extras))

        return ops.cast(outputs, v.dtype), grad

    return attend


def blockwise_attention(q, k, v, mask: AttentionMask | None = None, bias=None,
                        chunk_size: int | None = None, query_chunk_size: int | None = None,
                        position=None, offset=0, soft_cap: float | None = None):
    """`softmax(q kᵀ + bias) v` in blocks of keys, never holding `(T, S)`.

    Args:
        q: scaled queries `(..., T, d)`.
        k: keys `(..., S, d)`; leading axes broadcast against `q`'s.
        v: values `(..., S, dv)`.
        mask: optional `AttentionMask` (its query padding is the caller's to apply).
        bias: optional float bias broadcastable to `(..., T, S)`.
        chunk_size: keys per block; None sizes blocks by `keras_attn.tuning.auto_chunk_size`
            (a budget of scores over the batch and heads of a block).
        query_chunk_size: optional queries per block: a block then holds
            `query_chunk_size · chunk_size` scores, and causal attention skips the blocks
            above the diagonal; the backward pass then adds each block's key gradients into
            an `(S, d)` buffer, so it pays mainly for causal attention.
        position: optional `keras_attn.ops.PositionBias`, added tile by tile (never `(T, S)`),
            its parameters differentiated tile by tile.
        offset: int or scalar tensor, the position of query 0 for `position`.
        soft_cap: optional float `c`: the scores become `c · tanh(q kᵀ / c)` before the bias
            and the mask. Defaults to `None`.

    Returns:
        Outputs `(..., T, dv)` in the dtype of `v`; rows with nothing to attend to are zero,
        with zero gradient.
    """
    rank = max(len(q.shape), 3)
    query_len, key_len = _rows(q), _rows(k)
    q_chunk = query_chunk_size
    if q_chunk is not None and isinstance(query_len, int) and q_chunk >= query_len:
        q_chunk = None
    if chunk_size is None:
        chunk_size = tuning.auto_chunk_size(query_len if q_chunk is None else q_chunk, key_len,
                                            _static_lead(q, k))
    chunk = min(chunk_size, key_len) if isinstance(key_len, int) else chunk_size
    if q_chunk is None and isinstance(key_len, int) and chunk >= key_len:
        tile = None if mask is None else mask.block(rank=rank)
        if position is not None:
            dense = lay_out(position.dense(query_len, key_len, offset), lead_shape(q, k))
            bias = dense if bias is None else ops.cast(bias, "float32") + dense
        return dense_attention(q, k, v, tile, bias, return_weights=False, soft_cap=soft_cap)[0]

    num_key_blocks, key_pad = _blocks(key_len, chunk)
    query_pad, num_query_blocks = 0, None
    if q_chunk is not None:
        num_query_blocks, query_pad = _blocks(query_len, q_chunk)
    if mask is None:
        mask = AttentionMask(query_len, key_len)
    mask = mask.padded(query_pad, key_pad)
    if not mask.masks_keys:
        mask = None
    k, v = _pad(k, -2, key_pad), _pad(v, -2, key_pad)  # (..., S_pad, ·)
    q = _pad(q, -2, query_pad)  # (..., T_pad, d); padded rows are dropped below
    extras = ()
    if bias is not None:
        extras = (_pad(_pad(ops.convert_to_tensor(bias), -1, key_pad), -2, query_pad),)
    if position is not None:  # variables read once, as inputs of the custom gradient
        extras += tuple(ops.copy(param) for param in position.params)
    blocks = _Blocks(rank, mask, bias is not None, position, offset, lead_shape(q, k), chunk,
                     num_key_blocks, q_chunk, num_query_blocks, soft_cap)
    outputs = _attention_fn(blocks)(q, k, v, *extras)  # (..., T_pad, dv)
    if not (isinstance(query_pad, int) and query_pad == 0):
        outputs = _slice(outputs, -2, 0, query_len)  # (..., T, dv)
    return outputs
