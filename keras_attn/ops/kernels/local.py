"""The local kernel: sliding-window attention in O(T · window).

The sequence is cut into blocks of `window` positions; a block of queries attends to its own
block and its neighbours (previous and next; only the previous when causal), which hold every
key within the window, and the exact band is applied inside that `(w, 3w)` tile. So time and
memory are O(T · w) instead of the O(T²) of a dense band mask. The first `num_global` tokens
may be global: they attend to every key and every query attends to them (Longformer, Beltagy
et al., 2020).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_attn import tuning
from keras_attn._checks import static_int
from keras_attn.ops.dropout import dropout
from keras_attn.ops.kernels.common import lay_out, lead_shape, scores
from keras_attn.ops.masks import AttentionMask
from keras_attn.ops.softmax import masked_softmax


def _neighbour_blocks(x, causal: bool):
    """`(..., N, b, ·)` -> `(..., N, 3b, ·)`: blocks n-1, n, n+1 side by side (causal: n-1, n).

    Missing neighbours at the ends are zero blocks (their keys are masked out as invalid).
    """
    padding = [[0, 0] for _ in x.shape]
    padding[-3] = [1, 0 if causal else 1]
    padded = ops.pad(x, padding)  # (..., N + 2, b, ·), or N + 1 when causal
    if causal:
        parts = [padded[..., :-1, :, :], padded[..., 1:, :, :]]
    else:
        parts = [padded[..., :-2, :, :], padded[..., 1:-1, :, :], padded[..., 2:, :, :]]
    return ops.concatenate(parts, axis=-2)


def _band_within_tile(block: int, window: int, causal: bool) -> np.ndarray:
    """Static `(b, 3b)` band of one tile: query `r` of block n is at `n·b + r`, tile key `c` at
    `(n - 1)·b + c`, so the distance `r + b - c` depends on `(r, c)` only."""
    width = 2 * block if causal else 3 * block
    diff = np.arange(block)[:, None] + block - np.arange(width)[None, :]
    if causal:
        return (diff >= 0) & (diff <= window)
    return np.abs(diff) <= window


def _expand(x, rank: int):
    """`(B, ...)` with axes inserted after the batch axis up to `rank`."""
    while len(x.shape) < rank:
        x = ops.expand_dims(x, 1)
    return x


def local_attention(q, k, v, mask: AttentionMask, dropout_rate: float = 0.0, seed=None,
                    position=None):
    """Sliding-window `softmax(q kᵀ + bias) v` over the window of `mask`, blockwise.

    Args:
        q: scaled queries `(..., T, d)`.
        k: keys `(..., T, d)`: as many as queries, aligned by position.
        v: values `(..., T, dv)`.
        mask: an `AttentionMask` with a `window`; besides it, only causality, key padding and
            `num_global` (a dense mask or per-query lengths raise a ValueError).
        dropout_rate: float in [0, 1), dropout on the weights (0 outside training).
        seed: the dropout's seed.
        position: optional relative `keras_attn.ops.PositionBias`: every window tile gets the
            same `(H, b, 3b)` bias (it depends on `key - query` only).

    Returns:
        `(..., T, dv)` in the dtype of `v`; a query with no visible valid key gets zeros.
    """
    if position is not None and not position.relative:
        raise ValueError(
            "The local kernel takes position biases that depend on key - query only. "
            f"Received: position_bias={position!r}"
        )
    if mask is None or mask.window is None:
        raise ValueError("The local kernel needs an `AttentionMask` with a `window`.")
    if static_int(mask.offset) != 0:
        raise ValueError(
            "The local kernel needs queries and keys aligned by position (offset 0). "
            f"Received: offset={mask.offset!r}"
        )
    q_len, k_len = q.shape[-2], k.shape[-2]
    if None not in (q_len, k_len) and q_len != k_len:
        raise ValueError(
            "The local kernel needs as many keys as queries (positions are aligned). "
            f"Received: query.shape={tuple(q.shape)}, key.shape={tuple(k.shape)}"
        )
    window, causal = mask.window, mask.causal
    num_global = mask.num_global if q_len is None else min(mask.num_global, q_len)
    rank = len(q.shape)
    seq_len, value_depth = ops.shape(q)[-2], v.shape[-1]
    valid = mask.key_padding("The local kernel", allow_causal=True, allow_window=True)
    if valid is None:
        valid = ops.ones((1, seq_len), "bool")  # (B | 1, T): which keys exist and count

    block = max(window, 1)
    pad = (-seq_len) % block

    def blocks_of(x):  # (..., T, ·) -> (..., N, b, ·), zero-padded to whole blocks
        widths = [[0, 0] for _ in x.shape]
        widths[-2][1] = pad
        x = ops.pad(x, widths)
        return ops.reshape(x, tuple(ops.shape(x)[:-2]) + (-1, block, x.shape[-1]))

    q_blocks = blocks_of(q)  # (..., N, b, d)
    k_tile = _neighbour_blocks(blocks_of(k), causal)  # (..., N, cb, d), cb = 3b (2b causal)
    v_tile = _neighbour_blocks(blocks_of(v), causal)  # (..., N, cb, dv)
    num_blocks = ops.shape(q_blocks)[-3]
    valid_blocks = blocks_of(ops.cast(valid, "float32")[:, :, None])  # (B, N, b, 1)
    valid_tile = ops.cast(ops.swapaxes(_neighbour_blocks(valid_blocks, causal), -1, -2),
                          "bool")  # (B, N, 1, cb)
    tile_width = ops.shape(k_tile)[-2]
    tile_mask = ops.logical_and(
        ops.convert_to_tensor(_band_within_tile(block, window, causal)), valid_tile
    )  # (B, N, b, cb)
    lead = lead_shape(q, k)
    s = scores(q_blocks, k_tile)  # (..., N, b, cb) float32
    if position is not None:  # query r of a tile at b + r, tile key c at c
        rel = position.tile(ops.arange(block, dtype="int32")[:, None] + block,
                            ops.arange(tile_width, dtype="int32")[None, :])  # (H, b, cb)
        s = s + ops.expand_dims(lay_out(rel, lead), -3)  # (1, ..., 1, b, cb)
    if num_global:
        # Global keys get their own columns, so hide them in the tile to count them once.
        tile_pos = (ops.arange(num_blocks, dtype="int32")[:, None] - 1) * block + ops.arange(
            tile_width, dtype="int32")  # (N, cb)
        tile_mask = ops.logical_and(tile_mask, ops.greater_equal(tile_pos, num_global)[:, None])
        k_glob, v_glob = k[..., :num_global, :], v[..., :num_global, :]  # (..., g, ·)
        glob_scores = scores(q_blocks, ops.expand_dims(k_glob, -3))  # (..., N, b, g)
        if position is not None:
            glob_bias = position.tile(
                ops.arange(num_blocks * block, dtype="int32")[:, None],
                ops.arange(num_global, dtype="int32")[None, :])  # (H, N·b, g)
            glob_scores = glob_scores + ops.reshape(
                glob_bias, (1,) + tuple(lead[1:]) + (num_blocks, block, num_global))
        query_pos = ops.arange(num_blocks, dtype="int32")[:, None] * block + ops.arange(
            block, dtype="int32")  # (N, b)
        glob_mask = valid[:, None, None, :num_global]  # (B, 1, 1, g)
        if causal:
            glob_mask = ops.logical_and(glob_mask, ops.greater_equal(
                query_pos[..., None], ops.arange(num_global, dtype="int32")))  # (B, N, b, g)
        full = (ops.shape(valid)[0], num_blocks, block)
        tile_mask = ops.concatenate(
            [ops.broadcast_to(glob_mask, full + (num_global,)),
             ops.broadcast_to(tile_mask, full + (tile_width,))], axis=-1)  # (B, N, b, g + cb)
        s = ops.concatenate([glob_scores, s], axis=-1)

    weights = ops.cast(masked_softmax(s, mask=_expand(tile_mask, rank + 1)), v.dtype)
    if dropout_rate > 0.0:
        weights = dropout(weights, dropout_rate, seed=seed)
    outputs = tuning.matmul(weights[..., num_global:], v_tile)  # (..., N, b, dv)
    if num_global:
        outputs = outputs + tuning.matmul(weights[..., :num_global],
                                          ops.expand_dims(v_glob, -3))
    outputs = ops.reshape(outputs, tuple(ops.shape(outputs)[:-3]) + (-1, value_depth))
    outputs = outputs[..., :seq_len, :]  # (..., T, dv)
    if not num_global:
        return outputs
    # Global queries attend to every key: a (g, T) dense strip, O(g·T).
    strip_mask = _expand(valid[:, None, :], rank)  # (B, 1.., 1, T)
    if causal:
        strip_mask = ops.logical_and(strip_mask, ops.arange(seq_len)[None, :] <= ops.arange(
            num_global)[:, None])  # (.., g, T)
    strip = scores(q[..., :num_global, :], k)  # (..., g, T)
    if position is not None:
        strip = strip + lay_out(position.dense(num_global, seq_len), lead)
    strip_weights = ops.cast(masked_softmax(strip, mask=strip_mask), v.dtype)
    if dropout_rate > 0.0:
        strip_weights = dropout(strip_weights, dropout_rate, seed=seed)
    glob_out = tuning.matmul(strip_weights, v)  # (..., g, dv)
    return ops.concatenate([glob_out, outputs[..., num_global:, :]], axis=-2)
