"""Sliding-window (local) attention in O(n·w): each query sees keys within `window` positions.

The sequence is cut into blocks of `window` positions; a block of queries attends to its own
block and its neighbours (previous and next; only the previous when causal), which contain every
key within the window, and the exact band mask is applied inside that `(w, 3w)` tile. So the
cost is O(n·w) time and memory instead of the O(n²) of a dense band mask. Optionally the first
`num_global` tokens are global: they attend to every key and every query attends to them
(Longformer, Beltagy et al., 2020).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import check_int
from keras_attn.layers.linear_attention import padding_masks
from keras_attn.layers.multi_head import MultiHead


def local_attention_mask(
    query_len: int,
    key_len: int,
    window: int,
    causal: bool = False,
    num_global: int = 0,
    offset=0,
):
    """The dense `(T, S)` boolean band mask that local attention applies (True = attend).

    Query `i` sits at key position `p = i + offset` and may attend key `j` when
    `|p - j| <= window` (causal: `0 <= p - j <= window`), or when `p` or `j` is one of the first
    `num_global` positions; `causal` also hides every `j > p` from global tokens.

    Args:
        query_len: `T`.
        key_len: `S`.
        window: int >= 0, the half-width of the band.
        causal: bool. Defaults to `False`.
        num_global: int >= 0, number of leading global tokens. Defaults to `0`.
        offset: int or scalar tensor, key position of query 0 (cached decoding).
            Defaults to `0`.

    Returns:
        Boolean tensor `(T, S)`.
    """
    check_int("window", window, 0)
    check_int("num_global", num_global, 0)
    rows = ops.expand_dims(ops.arange(query_len, dtype="int32"), -1) + ops.cast(offset, "int32")
    cols = ops.expand_dims(ops.arange(key_len, dtype="int32"), 0)
    diff = rows - cols  # (T, S)
    allowed = ops.less_equal(ops.abs(diff), window)
    if num_global:
        allowed = ops.logical_or(
            allowed, ops.logical_or(ops.less(rows, num_global), ops.less(cols, num_global))
        )
    if causal:
        allowed = ops.logical_and(allowed, ops.greater_equal(diff, 0))
    return allowed


def _neighbour_blocks(x, causal: bool):
    """`(B, H, N, b, ·)` -> `(B, H, N, 3b, ·)`: blocks n-1, n, n+1 side by side (causal: n-1, n).

    Missing neighbours at the ends are zero blocks (their keys are masked out as invalid).
    """
    padding = [[0, 0]] * len(x.shape)
    padding[2] = [1, 0 if causal else 1]
    padded = ops.pad(x, padding)  # (B, H, N + 2, b, ·), or N + 1 when causal
    if causal:
        parts = [padded[:, :, :-1], padded[:, :, 1:]]
    else:
        parts = [padded[:, :, :-2], padded[:, :, 1:-1], padded[:, :, 2:]]
    return ops.concatenate(parts, axis=3)


def _band_within_tile(block: int, window: int, causal: bool) -> np.ndarray:
    """Static `(b, 3b)` band of one tile: query `r` of block n is at `n·b + r`, tile key `c` at
    `(n - 1)·b + c`, so the distance `r + b - c` depends on `(r, c)` only."""
    width = 2 * block if causal else 3 * block
    diff = np.arange(block)[:, None] + block - np.arange(width)[None, :]
    if causal:
        return (diff >= 0) & (diff <= window)
    return np.abs(diff) <= window


def local_dot_product_attention(
    query,
    key,
    value,
    window: int,
    causal: bool = False,
    key_valid_lens=None,
    num_global: int = 0,
    key_mask=None,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    training: bool = False,
    seed=None,
):
    """Sliding-window scaled dot-product attention, computed blockwise in O(T·window).

    Equal to `dot_product_attention` with the mask of `local_attention_mask` (and the key
    padding masks), without ever forming the `(T, T)` matrix. Scores and softmax in float32.

    Args:
        query: `(B, H, T, d)`.
        key: `(B, H, T, d)`: as many keys as queries, aligned by position.
        value: `(B, H, T, dv)`.
        window: int >= 0: query `i` sees keys `|i - j| <= window` (causal: `i - window <= j
            <= i`). Also the block size.
        causal: bool. Defaults to `False`.
        key_valid_lens: optional `(B,)` number of valid keys. Defaults to `None`.
        num_global: int >= 0, the first `num_global` tokens attend to and are attended by
            every position (still subject to `causal`). Defaults to `0`.
        key_mask: optional boolean `(B, T)`, True = valid key. Defaults to `None`.
        scale: float multiplying the scores. Defaults to `1 / sqrt(d)`.
        dropout_rate: float in [0, 1), dropout on the attention weights when training.
        training: bool, whether dropout is active.
        seed: int or `keras.random.SeedGenerator` for the dropout.

    Returns:
        `(B, H, T, dv)` in the dtype of `value`; a query with no visible valid key gets zeros.

    Example:
    >>> q = k = v = keras.ops.ones((1, 2, 4096, 32))
    >>> local_dot_product_attention(q, k, v, window=128, causal=True).shape  # (1, 2, 4096, 32)
    """
    check_int("window", window, 0)
    check_int("num_global", num_global, 0)
    q_len, k_len = query.shape[2], key.shape[2]
    if None not in (q_len, k_len) and q_len != k_len:
        raise ValueError(
            "Local attention needs as many keys as queries (positions are aligned). "
            f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if q_len is not None:
        num_global = min(num_global, q_len)
    batch, heads, seq_len, depth = ops.shape(query)
    value_depth = ops.shape(value)[-1]
    if scale is None:
        scale = 1.0 / float(np.sqrt(query.shape[-1]))

    valid = ops.ones((batch, seq_len), "bool")  # (B, T): which keys exist and are not padding
    if key_valid_lens is not None:
        valid = ops.logical_and(valid, attn_ops.sequence_mask(key_valid_lens, seq_len))
    if key_mask is not None:
        valid = ops.logical_and(valid, ops.cast(key_mask, "bool"))

    block = max(window, 1)
    pad = (-seq_len) % block
    seq_padding = [[0, 0], [0, 0], [0, pad], [0, 0]]
    q = ops.pad(query * ops.cast(scale, query.dtype), seq_padding)
    q = ops.reshape(q, (batch, heads, -1, block, depth))  # (B, H, N, b, d)
    k = ops.reshape(ops.pad(key, seq_padding), (batch, heads, -1, block, depth))
    v = ops.reshape(ops.pad(value, seq_padding), (batch, heads, -1, block, value_depth))
    num_blocks = ops.shape(q)[2]
    k_tile = _neighbour_blocks(k, causal)  # (B, H, N, cb, d), cb = 3b (2b when causal)
    v_tile = _neighbour_blocks(v, causal)  # (B, H, N, cb, dv)
    valid_padded = ops.pad(ops.cast(valid, "float32"), [[0, 0], [0, pad]])  # (B, N·b)
    valid_tile = _neighbour_blocks(ops.reshape(valid_padded, (batch, 1, -1, block, 1)), causal)
    valid_tile = ops.cast(ops.swapaxes(valid_tile, -1, -2), "bool")  # (B, 1, N, 1, cb)

    tile_width = ops.shape(k_tile)[3]
    mask = ops.logical_and(
        ops.convert_to_tensor(_band_within_tile(block, window, causal)), valid_tile
    )  # (B, 1, N, b, cb)
    scores = ops.cast(ops.matmul(q, ops.swapaxes(k_tile, -1, -2)), "float32")  # (B,H,N,b,cb)
    if num_global:
        # Global keys get their own columns, so hide them in the tile to count them once.
        tile_pos = (ops.arange(num_blocks, dtype="int32")[:, None] - 1) * block + ops.arange(
            tile_width, dtype="int32"
        )  # (N, cb)
        mask = ops.logical_and(mask, ops.greater_equal(tile_pos, num_global)[:, None, :])
        k_glob, v_glob = key[:, :, :num_global], value[:, :, :num_global]  # (B, H, g, ·)
        glob_scores = ops.matmul(q, ops.expand_dims(ops.swapaxes(k_glob, -1, -2), 2))
        query_pos = ops.arange(num_blocks, dtype="int32")[:, None] * block + ops.arange(
            block, dtype="int32"
        )  # (N, b)
        glob_mask = valid[:, None, None, None, :num_global]  # (B, 1, 1, 1, g)
        if causal:
            glob_mask = ops.logical_and(
                glob_mask,
                ops.greater_equal(query_pos[..., None], ops.arange(num_global, dtype="int32")),
            )  # (B, 1, N, b, g)
        full = (batch, 1, num_blocks, block)
        mask = ops.concatenate(
            [ops.broadcast_to(glob_mask, full + (num_global,)),
             ops.broadcast_to(mask, full + (tile_width,))],
            axis=-1,
        )  # (B, 1, N, b, g + cb)
        scores = ops.concatenate([ops.cast(glob_scores, "float32"), scores], axis=-1)

    weights = ops.cast(attn_ops.masked_softmax(scores, mask=mask), value.dtype)
    if training and dropout_rate > 0.0:
        weights = attn_ops.dropout(weights, dropout_rate, seed=seed)
    if num_global:
        outputs = ops.matmul(weights[..., num_global:], v_tile) + ops.matmul(
            weights[..., :num_global], ops.expand_dims(v_glob, 2)
        )  # (B, H, N, b, dv)
    else:
        outputs = ops.matmul(weights, v_tile)  # (B, H, N, b, dv)
    outputs = ops.reshape(outputs, (batch, heads, -1, value_depth))[:, :, :seq_len]

    if num_global:
        # Global queries attend to every key: a (g, T) dense strip, O(g·T).
        glob_q = query[:, :, :num_global] * ops.cast(scale, query.dtype)
        strip = ops.matmul(glob_q, ops.swapaxes(key, -1, -2))  # (B, H, g, T)
        strip_mask = valid[:, None, None, :]  # (B, 1, 1, T)
        if causal:
            strip_mask = ops.logical_and(strip_mask, attn_ops.causal_mask(num_global, seq_len))
        strip_weights = ops.cast(
            attn_ops.masked_softmax(ops.cast(strip, "float32"), mask=strip_mask), value.dtype
        )
        if training and dropout_rate > 0.0:
            strip_weights = attn_ops.dropout(strip_weights, dropout_rate, seed=seed)
        glob_out = ops.matmul(strip_weights, value)  # (B, H, g, dv)
        outputs = ops.concatenate([glob_out, outputs[:, :, num_global:]], axis=2)
    return outputs


@keras.saving.register_keras_serializable(package="keras_attn")
class LocalMultiHead(MultiHead):
    """Multi-head sliding-window attention: `MultiHead` whose heads see a band of keys.

    Each query attends to keys within `window` positions (with `use_causal_mask=True`, the
    `window` positions before it and itself), plus the first `num_global` global tokens, which
    attend everywhere. Computed blockwise by `local_dot_product_attention` in O(T·window).

    A few calls fall back to `MultiHead`'s dense path with the band added to the mask (same
    numbers, O(T·S)): an explicit `attention_mask`, per-query `(B, T)` valid_lens,
    `return_attention_scores=True` (the weights are `(B, H, T, S)`), and the decoding `cache`
    (one query against the cache: the band is applied at position `cache_update_index`).

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each head for query and key.
        window: int >= 0, half-width of the band.
        num_global: int >= 0, number of leading global tokens. Defaults to `0`.
        value_dim: int, size of each head for value. Defaults to `key_dim`.
        output_dim: int, size of the output. Defaults to the last dimension of the query.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        use_bias: bool, whether the four projections have biases. Defaults to `True`.
        kernel_initializer: initializer of the projection kernels. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of the projection biases. Defaults to `"zeros"`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        As `MultiHead`; `key` and `value` must have the query's length (aligned positions).

    Returns:
        `(B, T, output_dim)`; with a `cache`, `(outputs, cache)`; with
        `return_attention_scores=True`, also the weights `(B, H, T, S)`.

    Example:
    >>> layer = LocalMultiHead(num_heads=4, key_dim=16, window=64)
    >>> layer(keras.ops.ones((2, 8192, 64)), use_causal_mask=True).shape  # (2, 8192, 64)

    References:
        Beltagy et al., 2020, "Longformer: The Long-Document Transformer",
        https://arxiv.org/abs/2004.05150
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        window: int,
        num_global: int = 0,
        value_dim: int | None = None,
        output_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            output_dim=output_dim,
            dropout=dropout,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            seed=seed,
            **kwargs,
        )
        check_int("window", window, 0)
        check_int("num_global", num_global, 0)
        self.window = window
        self.num_global = num_global

    def call(
        self,
        query,
        key=None,
        value=None,
        valid_lens=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        key_mask=None,
        value_mask=None,
        cache=None,
        cache_update_index=None,
    ):
        if valid_lens is not None:
            valid_lens = ops.convert_to_tensor(valid_lens)
        per_query_lens = valid_lens is not None and len(valid_lens.shape) == 2
        if cache is not None or attention_mask is not None or return_attention_scores or (
            per_query_lens
        ):
            if cache is not None:
                key_len = ops.shape(cache[0])[2]
            else:
                key_len = ops.shape(query if key is None else key)[1]
            band = local_attention_mask(
                ops.shape(query)[1], key_len, self.window, bool(use_causal_mask),
                self.num_global, 0 if cache_update_index is None else cache_update_index,
            )[None]  # (1, T, S)
            if attention_mask is not None:
                band = ops.logical_and(ops.cast(attention_mask, "bool"), band)
            return super().call(
                query, key, value, valid_lens, band, use_causal_mask, return_attention_scores,
                training, query_mask, key_mask, value_mask, cache, cache_update_index,
            )
        key, value, query_mask, key_mask = padding_masks(
            query, key, value, valid_lens, None, query_mask, key_mask, value_mask,
            "LocalMultiHead",
        )
        q = self.split_heads(self.query_dense(query), self.key_dim)  # (B, H, T, dk)
        k = self.split_heads(self.key_dense(key), self.key_dim)  # (B, H, T, dk)
        v = self.split_heads(self.value_dense(value), self.value_dim)  # (B, H, T, dv)
        context = local_dot_product_attention(
            q, k, v, self.window, causal=bool(use_causal_mask), num_global=self.num_global,
            key_mask=key_mask, dropout_rate=self.dropout, training=bool(training),
            seed=self.seed_generator,
        )  # (B, H, T, dv)
        if query_mask is not None:  # padded queries attend nowhere, as in MultiHead
            context = context * ops.cast(query_mask, context.dtype)[:, None, :, None]
        return self.output_dense(self.merge_heads(context))  # (B, T, output_dim)

    def get_config(self):
        config = super().get_config()
        for name in ("add_bias_kv", "add_zero_attn"):  # always False here
            config.pop(name)
        config.update({"window": self.window, "num_global": self.num_global})
        return config
