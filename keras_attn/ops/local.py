"""`local_dot_product_attention`: sliding-window attention with its own argument names."""

from __future__ import annotations

from keras import ops

from keras_attn.ops.attention import dot_product_attention
from keras_attn.ops.masks import AttentionMask


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

    Equal to `dot_product_attention` with the band of `local_attention_mask` (and the key
    padding), without ever forming the `(T, T)` matrix: `dot_product_attention(...,
    mask=AttentionMask.build(..., window=window), implementation="local")`.

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
    query = ops.convert_to_tensor(query)
    mask = AttentionMask.build(
        ops.shape(query)[-2], ops.shape(key)[-2], query.shape[0], key_valid_lens,
        use_causal_mask=causal, window=window, num_global=num_global, key_mask=key_mask,
    )
    return dot_product_attention(query, key, value, mask, scale, dropout_rate, training, seed,
                                 implementation="local")[0]
