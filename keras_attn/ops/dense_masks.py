"""Dense boolean masks, `(T, S)` or `(B, T, S)`, for callers that want the mask itself.

Each is the `block()` of an `AttentionMask` built from the same arguments, so these functions
and the kernels agree by construction.
"""

from __future__ import annotations

from keras import ops

from keras_attn.ops.masks import AttentionMask


def causal_mask(query_len: int, key_len: int | None = None, offset=0):
    """Lower-triangular mask: query `i` may attend to key `j` when `j <= i + offset`.

    Args:
        query_len: int, number of queries `T`.
        key_len: int, number of keys `S`. Defaults to `query_len`.
        offset: int or scalar tensor, key position of query `0` (cached decoding).
            Defaults to `0`.

    Returns:
        Boolean tensor of shape `(T, S)`.
    """
    key_len = query_len if key_len is None else key_len
    return AttentionMask(query_len, key_len, causal=True, offset=offset).block()[0]


def local_attention_mask(query_len: int, key_len: int, window: int, causal: bool = False,
                         num_global: int = 0, offset=0):
    """The dense `(T, S)` band that sliding-window attention applies (True = attend).

    Query `i` sits at key position `p = i + offset` and may attend key `j` when
    `|p - j| <= window` (causal: `0 <= p - j <= window`), or when `p` or `j` is one of the first
    `num_global` positions (`causal` still hides every `j > p`).

    Args:
        query_len: `T`.
        key_len: `S`.
        window: int >= 0, the half-width of the band.
        causal: bool. Defaults to `False`.
        num_global: int >= 0, number of leading global tokens. Defaults to `0`.
        offset: int or scalar tensor, key position of query 0. Defaults to `0`.

    Returns:
        Boolean tensor `(T, S)`.
    """
    mask = AttentionMask.build(query_len, key_len, use_causal_mask=causal, causal_offset=offset,
                               window=window, num_global=num_global)
    return mask.block()[0]


def merge_masks(
    query_len: int,
    key_len: int,
    valid_lens=None,
    attention_mask=None,
    use_causal_mask: bool = False,
    query_mask=None,
    key_mask=None,
    causal_offset=0,
    batch_size=None,
):
    """Every way a mask can come in, as one dense boolean `(B, T, S)` mask (or None).

    The dense form of `AttentionMask.build(...)` with the query mask folded in (padded queries
    attend nowhere). Arguments as in `AttentionMask.build`.

    Returns:
        Boolean tensor broadcastable to `(B, T, S)`, or None when nothing masks.
    """
    mask = AttentionMask.build(
        query_len, key_len, batch_size, valid_lens, attention_mask, use_causal_mask,
        causal_offset, query_mask=query_mask, key_mask=key_mask,
    )
    block = mask.block()
    if mask.query_valid is None:
        return block
    rows = ops.expand_dims(mask.query_valid, -1)  # (B, T, 1); LiteRT: no [:, :, None] of bools
    return rows if block is None else ops.logical_and(block, rows)


def valid_lens_mask(valid_lens, query_len: int, key_len: int, batch_size=None):
    """d2l-style `valid_lens` as a boolean mask over keys: `(B, 1, S)` for `(B,)` lengths,
    `(B, T, S)` for `(B, T)` lengths."""
    return AttentionMask.build(query_len, key_len, batch_size, valid_lens).block()
