"""`dot_product_attention`: the one dispatch from projected queries, keys and values to a kernel.

Every attention layer projects, builds its `AttentionMask` once, and calls this function, which
checks the tensors, zeroes what the mask hides everywhere (so a non-finite number at a padded
position reaches neither outputs nor gradients), and hands the work to one kernel:

| implementation | kernel | memory | weights | dropout | masks |
|---|---|---|---|---|---|
| `"dense"` | `kernels.dense` | `T · S` | yes | yes | all |
| `"chunked"` | `kernels.blockwise` | `T · chunk` | no | no | all, built per block |
| `"local"` | `kernels.local` | `T · window` | no | yes | a window, causality, key padding |

Padded queries get zero weights and a zero output whichever kernel runs.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import (
    as_rate,
    check_bool,
    check_number,
    check_one_of,
    check_positive_int,
    static_int,
)
from keras_attn.ops.kernels.blockwise import blockwise_attention
from keras_attn.ops.kernels.common import lay_out, lead_shape
from keras_attn.ops.kernels.dense import dense_attention
from keras_attn.ops.kernels.local import local_attention
from keras_attn.ops.masks import AttentionMask
from keras_attn.ops.position import PositionBias

IMPLEMENTATIONS = ("dense", "chunked", "local")


def _check_float(name: str, x) -> None:
    dtype = keras.backend.standardize_dtype(x.dtype)
    if not keras.backend.is_float_dtype(dtype):
        raise ValueError(
            f"Argument `{name}` must be a floating-point tensor (attention layers cast integer "
            f"inputs to their compute dtype; this function does not). Received: "
            f"{name}.dtype={dtype}"
        )


def _check_tensors(query, key, value):
    shapes = {name: tuple(t.shape) for name, t in (("query", query), ("key", key),
                                                   ("value", value))}
    rank = len(shapes["query"])
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        _check_float(name, tensor)
        if len(shapes[name]) < 2 or len(shapes[name]) != rank:
            raise ValueError(
                "Arguments `query`, `key` and `value` must have the same rank >= 2, "
                f"(..., length, dim). Received: query.shape={shapes['query']}, "
                f"{name}.shape={shapes[name]}"
            )
    q, k, v = shapes["query"], shapes["key"], shapes["value"]
    if None not in (q[-1], k[-1]) and q[-1] != k[-1]:
        raise ValueError(
            "Arguments `query` and `key` must have the same last dimension. "
            f"Received: query.shape={q}, key.shape={k}"
        )
    if None not in (k[-2], v[-2]) and k[-2] != v[-2]:
        raise ValueError(
            "Arguments `key` and `value` must have the same length (axis -2). "
            f"Received: key.shape={k}, value.shape={v}"
        )
    for i in range(rank - 2):
        dims = {d for d in (q[i], k[i], v[i]) if d is not None and d != 1}
        if len(dims) > 1:
            raise ValueError(
                f"Arguments `query`, `key` and `value` must agree on axis {i} (or have size 1 "
                f"there, to share it). Received: query.shape={q}, key.shape={k}, "
                f"value.shape={v}"
            )


def _check_bias(bias, query, key):
    bias = ops.convert_to_tensor(bias)
    _check_float("attention_bias", bias)
    shape, q_len, k_len = tuple(bias.shape), query.shape[-2], key.shape[-2]
    fits = len(shape) <= len(query.shape) and len(shape) >= 2
    for got, want in zip(shape[-2:], (q_len, k_len)):
        fits = fits and (got in (1, None) or want is None or got == want)
    if not fits:
        raise ValueError(
            "Argument `attention_bias` must broadcast to the scores "
            f"(..., query_len={q_len}, key_len={k_len}). Received: attention_bias.shape={shape}"
        )
    return bias


def as_attention_mask(mask, query_len, key_len, batch_size=None, valid_lens=None,
                      use_causal_mask=False, causal_offset=0) -> AttentionMask | None:
    """An `AttentionMask` (or None) from `mask` (an `AttentionMask`, a boolean tensor or None)
    and the structured arguments; an `AttentionMask` comes with none of them."""
    if isinstance(mask, AttentionMask):
        if valid_lens is not None or use_causal_mask:
            raise ValueError(
                "Argument `mask` is an AttentionMask, which already holds every mask; pass "
                "`valid_lens` and `use_causal_mask` to `AttentionMask.build` instead. Received: "
                f"valid_lens={valid_lens!r}, use_causal_mask={use_causal_mask!r}"
            )
        for name, got, want in (("query_len", mask.query_len, query_len),
                                ("key_len", mask.key_len, key_len)):
            got, want = static_int(got), static_int(want)
            if None not in (got, want) and got != want:
                raise ValueError(
                    f"Argument `mask` was built for {name}={got}, but the inputs have "
                    f"{name}={want}."
                )
        return mask
    if mask is None and valid_lens is None and not use_causal_mask:
        return None
    return AttentionMask.build(query_len, key_len, batch_size, valid_lens, mask,
                               use_causal_mask, causal_offset, mask_name="mask")


def _expand_rows(valid, rank: int):
    """`(B, L)` boolean -> `(B, 1, ..., L, 1)` of rank `rank`."""
    valid = ops.expand_dims(valid, -1)
    while len(valid.shape) < rank:
        valid = ops.expand_dims(valid, 1)
    return valid


def dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    training: bool = False,
    seed=None,
    implementation: str = "dense",
    chunk_size: int | None = None,
    valid_lens=None,
    use_causal_mask: bool = False,
    *,
    bias=None,
    causal_offset=0,
    return_weights: bool | None = None,
    query_chunk_size: int | None = None,
    zero_masked_inputs: bool = True,
    position_bias: PositionBias | None = None,
):
    """Scaled dot-product attention, `softmax(Q Kᵀ · scale + bias) V`, by the chosen kernel.

    Args:
        query: `(..., T, d)`, e.g. `(B, T, d)` or `(B, H, T, d)`; floating point.
        key: `(..., S, d)`. Leading axes of size 1 are shared (a key/value head serving a
            group of query heads: `(B, H_kv, 1, S, d)` against `(B, H_kv, G, T, d)`).
        value: `(..., S, dv)`.
        mask: optional boolean `(T, S)`, `(B, T, S)` or `(B, H, T, S)` (axes of size 1
            broadcast), True = attend; or an `AttentionMask` holding every mask of the call.
        scale: float multiplying the scores. Defaults to `1 / sqrt(d)`.
        dropout_rate: float in [0, 1), dropout on the attention weights when training.
        training: bool, whether dropout is active. Defaults to `False`.
        seed: int or `keras.random.SeedGenerator` for the dropout.
        implementation: `"dense"`, `"chunked"` (blockwise over keys, memory `T · chunk_size`,
            no dropout in training, no weights) or `"local"` (a sliding window from the
            `AttentionMask`, memory `T · window`). Defaults to `"dense"`.
        chunk_size: optional int, keys per block when chunked; `None` sizes blocks by
            `keras_attn.tuning`. Defaults to `None`.
        valid_lens: optional integer `(B,)` or `(B, T)` number of valid keys.
        use_causal_mask: bool, query `i` sees keys `j <= i + causal_offset`.
        bias: optional float tensor broadcastable to `(..., T, S)`, added to the scaled scores
            (a torch-style additive mask, any bias). Not with `"local"`.
        causal_offset: int or scalar tensor, key position of query 0 (for the causal mask
            and `position_bias`). Defaults to `0`.
        return_weights: bool or None: whether to return the weights; `None` returns them when
            the dense kernel runs. Without them the dense kernel keeps the weights for a fused
            backward pass instead of the backend's differentiation. Defaults to `None`.
        query_chunk_size: optional int, queries per block when chunked. Defaults to `None`.
        zero_masked_inputs: bool, zero the queries and keys the mask hides everywhere before
            attending (a layer that zeroed its inputs before projecting may skip it).
            Defaults to `True`.
        position_bias: optional `keras_attn.ops.PositionBias` (`AlibiBias`,
            `RelativePositionBias`) over `H` heads, spread over the leading axes after the batch
            (`(B, H, T, d)` inputs, or `(B, H_kv, G, T, d)`): the dense kernel adds it whole,
            the blockwise kernel tile by tile, the local kernel per window. Defaults to `None`.

    Returns:
        `(outputs, weights)`: outputs `(..., T, dv)` in the dtype of `value`, weights
        `(..., T, S)` or None. Rows with nothing to attend to have zero weights and outputs.

    Example:
    >>> q = keras.random.normal((2, 4, 128, 16))
    >>> out, w = dot_product_attention(q, q, q, use_causal_mask=True)  # (2,4,128,16), (2,4,128,128)
    """
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    _check_tensors(query, key, value)
    check_number("scale", scale, allow_none=True)
    dropout_rate = as_rate("dropout_rate", dropout_rate)
    check_one_of("implementation", implementation, IMPLEMENTATIONS)
    check_positive_int("chunk_size", chunk_size, allow_none=True)
    check_positive_int("query_chunk_size", query_chunk_size, allow_none=True)
    if return_weights is not None:
        check_bool("return_weights", return_weights)
    rate = dropout_rate if training else 0.0
    if implementation != "dense" and return_weights:
        raise ValueError(
            f"Argument `return_weights=True` needs the (T, S) weights, which "
            f"implementation={implementation!r} never forms; use implementation=\"dense\"."
        )
    for name, size in (("chunk_size", chunk_size), ("query_chunk_size", query_chunk_size)):
        if size is not None and implementation != "chunked":
            raise ValueError(
                f"Argument `{name}` applies to implementation=\"chunked\" only. Received: "
                f"{name}={size!r}, implementation={implementation!r}"
            )
    if implementation == "chunked" and rate > 0.0:
        raise ValueError(
            "Argument `implementation=\"chunked\"` does not support dropout on the attention "
            "weights; use implementation=\"dense\" or dropout_rate=0. Received: "
            f"dropout_rate={dropout_rate}, training=True"
        )
    if bias is not None:
        if implementation == "local":
            raise ValueError(
                "Argument `bias` is not supported by implementation=\"local\", whose tiles "
                "never hold the (T, S) scores; use implementation=\"dense\" or \"chunked\"."
            )
        bias = _check_bias(bias, query, key)
    if position_bias is not None and not isinstance(position_bias, PositionBias):
        raise ValueError(
            "Argument `position_bias` must be a keras_attn.ops.PositionBias (AlibiBias, "
            f"RelativePositionBias). Received: position_bias={position_bias!r}"
        )
    mask = as_attention_mask(mask, ops.shape(query)[-2], ops.shape(key)[-2], query.shape[0],
                             valid_lens, use_causal_mask, causal_offset)
    rank = len(query.shape)
    if mask is not None and mask.rank > rank:
        raise ValueError(
            f"Argument `mask` has a head axis (rank {mask.rank}) but the inputs have rank {rank}. "
            f"Received: query.shape={tuple(query.shape)}"
        )
    query_valid = None if mask is None else mask.query_valid
    if mask is not None and zero_masked_inputs:
        visible = mask.key_visible()
        if visible is not None:
            visible = _expand_rows(visible, rank)  # (B, 1.., S, 1)
            key = ops.where(visible, key, ops.zeros_like(key))
            value = ops.where(visible, value, ops.zeros_like(value))
        if query_valid is not None:
            query = ops.where(_expand_rows(query_valid, rank), query, ops.zeros_like(query))
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    # Scale the query before the product (fewer multiplications than scaling the scores).
    query = query * ops.cast(scale, query.dtype)

    weights = None
    if key.shape[-2] == 0:  # no keys: every kernel's answer is the dense one, all zeros
        implementation = "dense"
    if implementation == "dense":
        tile = None if mask is None else mask.block(rank=max(rank, mask.rank))
        if position_bias is not None:
            dense = lay_out(position_bias.dense(ops.shape(query)[-2], ops.shape(key)[-2],
                                                causal_offset), lead_shape(query, key))
            bias = dense if bias is None else ops.cast(bias, "float32") + dense
        outputs, weights = dense_attention(query, key, value, tile, bias, rate, seed,
                                           return_weights is not False)
    elif implementation == "chunked":
        outputs = blockwise_attention(query, key, value, mask, bias, chunk_size,
                                      query_chunk_size, position_bias, causal_offset)
    else:
        outputs = local_attention(query, key, value, mask, rate, seed, position_bias)
    if query_valid is not None:
        rows = _expand_rows(query_valid, rank)  # (B, 1.., T, 1)
        outputs = ops.where(rows, outputs, ops.zeros_like(outputs))
        if weights is not None:
            weights = ops.where(rows, weights, ops.zeros_like(weights))
    return outputs, weights
