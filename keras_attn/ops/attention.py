"""`dot_product_attention`: scaled dot-product attention as an op, on any kernel.

The op checks its arguments, zeroes what the mask hides everywhere in them (so a non-finite
number at a padded position reaches neither outputs nor gradients) and calls
`keras_attn.ops.attend`, the seam every attention layer calls after projecting (see
`keras_attn.ops.dispatch` for the kernels and the fallback policy). Masks come as one
`AttentionMask` (build it with `AttentionMask.build`) or a boolean tensor.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import (
    as_rate,
    check_bool,
    check_number,
    check_one_of,
    check_positive_int,
    static_int,
    warn_deprecated,
)
from keras_attn.ops.dispatch import IMPLEMENTATIONS, attend, query_groups
from keras_attn.ops.masks import AttentionMask
from keras_attn.ops.position import PositionBias

# Arguments earlier releases took beside `mask`; they now go to `AttentionMask.build`.
DEPRECATED_MASK_ARGUMENTS = ("valid_lens", "use_causal_mask", "causal_offset")


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
    grouped = query_groups(query, key) > 1  # key/value heads dividing the query heads
    for i in range(rank - 2):
        dims = {d for d in (q[i], k[i], v[i]) if d is not None and d != 1}
        if grouped and i == 1:
            dims = {d for d in (k[i], v[i]) if d is not None and d != 1}
        if len(dims) > 1:
            raise ValueError(
                f"Arguments `query`, `key` and `value` must agree on axis {i} (or have size 1 "
                f"there, to share it). Received: query.shape={q}, key.shape={k}, "
                f"value.shape={v}"
            )


def check_bias(bias, query, key, name: str = "attention_bias"):
    """`bias` as a float tensor broadcastable to the scores `(..., T, S)` of `query` and
    `key`, else a ValueError naming `name`."""
    bias = ops.convert_to_tensor(bias)
    _check_float(name, bias)
    shape, q_len, k_len = tuple(bias.shape), query.shape[-2], key.shape[-2]
    fits = 2 <= len(shape) <= len(query.shape)
    for got, want in zip(shape[-2:], (q_len, k_len)):
        fits = fits and (got in (1, None) or want is None or got == want)
    if not fits:
        raise ValueError(
            f"Argument `{name}` must broadcast to the scores "
            f"(..., query_len={q_len}, key_len={k_len}). Received: {name}.shape={shape}"
        )
    return bias


def as_attention_mask(mask, query_len, key_len, batch_size=None, **parts):
    """An `AttentionMask` (or None) from `mask` (an `AttentionMask`, a boolean tensor or None)
    and, for the deprecated loose arguments, `valid_lens`, `use_causal_mask`, `causal_offset`."""
    parts = {name: value for name, value in parts.items() if value is not None}
    if isinstance(mask, AttentionMask):
        if parts:
            raise ValueError(
                "Argument `mask` is an AttentionMask, which already holds every mask; pass "
                f"{sorted(parts)} to `AttentionMask.build` instead. Received: {parts}"
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
    if mask is None and not parts:
        return None
    return AttentionMask.build(query_len, key_len, batch_size, parts.get("valid_lens"), mask,
                               bool(parts.get("use_causal_mask", False)),
                               parts.get("causal_offset", 0), mask_name="mask")


def _deprecated(arguments: dict) -> dict:
    """The deprecated loose mask arguments (with a warning); unknown names are refused."""
    unknown = sorted(set(arguments) - set(DEPRECATED_MASK_ARGUMENTS) - {"zero_masked_inputs"})
    if unknown:
        raise ValueError(
            f"dot_product_attention() got unexpected arguments {unknown}. Masks come in one "
            "`mask` (an AttentionMask from `AttentionMask.build(...)`, or a boolean tensor)."
        )
    if arguments:
        warn_deprecated(
            f"dot_product_attention(): {sorted(arguments)} are deprecated; build one mask with "
            "`keras_attn.ops.AttentionMask.build(query_len, key_len, batch_size, valid_lens="
            "..., use_causal_mask=..., causal_offset=...)` and pass it as `mask`. Inputs are "
            "zeroed once where they come in, so `zero_masked_inputs` has no use.")
    if arguments.get("use_causal_mask") is False:
        arguments.pop("use_causal_mask")
    return {name: value for name, value in arguments.items() if name != "zero_masked_inputs"}


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
    *,
    bias=None,
    position_bias: PositionBias | None = None,
    return_weights: bool | None = None,
    query_chunk_size: int | None = None,
    soft_cap: float | None = None,
    flash_attention: bool | None = None,
    **deprecated,
):
    """Scaled dot-product attention, `softmax(Q Kᵀ · scale + bias) V`, by the chosen kernel.

    Args:
        query: `(..., T, d)`, e.g. `(B, T, d)` or `(B, H, T, d)`; floating point.
        key: `(..., S, d)`. Leading axes of size 1 are shared; `(B, H_kv, S, d)` keys with
            `H_kv` dividing the `H` query heads are grouped-query attention.
        value: `(..., S, dv)`.
        mask: optional `AttentionMask` holding every mask of the call (lengths, causality and
            its offset, a window, padding: `AttentionMask.build(...)`), or a boolean `(T, S)`,
            `(B, T, S)` or `(B, H, T, S)` tensor (axes of size 1 broadcast), True = attend.
        scale: float multiplying the scores. Defaults to `1 / sqrt(d)`.
        dropout_rate: float in [0, 1), dropout on the attention weights when training.
        training: bool, whether dropout is active. Defaults to `False`.
        seed: int or `keras.random.SeedGenerator` for the dropout.
        implementation: `"dense"`, `"fused"` (the backend's own fused op: torch's
            `scaled_dot_product_attention`, `jax.nn.dot_product_attention`, Keras' op on
            TensorFlow; calls it cannot compute exactly run the dense kernel, see
            `keras_attn.ops.kernel_for`), `"auto"` (the kernel measured fastest on this
            backend and device, `keras_attn.tuning.AUTO_KERNELS`), `"chunked"` (blockwise over
            keys, memory `T · chunk_size`, no dropout in training, no weights), `"local"` (the mask's sliding window, memory
            `T · window`; the dense kernel runs instead where the window kernel cannot apply
            the call, see `keras_attn.ops.kernel_for`) or `"linear"` (kernelized attention
            φ(q)(φ(k)ᵀv), φ = elu + 1: not softmax, no scale, bias or dropout). Defaults to
            `"dense"`.
        chunk_size: optional int, keys per block (`"chunked"`; `None` sizes blocks by
            `keras_attn.tuning`) or the causal prefix-sum chunk (`"linear"`, 64).
        bias: optional float tensor broadcastable to `(..., T, S)`, added to the scaled scores
            (a torch-style additive mask, any bias).
        position_bias: optional `keras_attn.ops.PositionBias` (`AlibiTileBias`,
            `RelativeTileBias`) over `H` heads, placed by the mask's `offset`: the dense
            kernel adds it whole, the blockwise kernel tile by tile, the local kernel per
            window. Defaults to `None`.
        return_weights: bool or None: whether to return the weights; `None` returns them when
            the dense kernel runs. Without them the dense kernel keeps the weights for a fused
            backward pass instead of the backend's differentiation. Defaults to `None`.
        query_chunk_size: optional int, queries per block when chunked. Defaults to `None`.
        soft_cap: optional float `c` > 0: the scaled scores become `c · tanh(scores / c)`
            before the bias and the mask (Gemma's attention logit soft-capping). Defaults to
            `None`.
        flash_attention: None, True or False, Keras' meaning: with `"fused"` or `"auto"`,
            None lets the backend choose, True asks for a flash kernel (a ValueError where the
            backend, the device or the call cannot have one, e.g. on any CPU), False for none.
            Defaults to `None`.
        **deprecated: `valid_lens`, `use_causal_mask`, `causal_offset` (build the mask with
            `AttentionMask.build` instead) and `zero_masked_inputs` (no longer used), accepted
            with a DeprecationWarning.

    Returns:
        `(outputs, weights)`: outputs `(..., T, dv)` in the dtype of `value`, weights
        `(..., T, S)` or None. Rows with nothing to attend to have zero weights and outputs.

    Example:
    >>> q = keras.random.normal((2, 4, 128, 16))
    >>> mask = AttentionMask.build(128, 128, use_causal_mask=True)
    >>> out, w = dot_product_attention(q, q, q, mask)  # (2, 4, 128, 16), (2, 4, 128, 128)
    """
    loose = _deprecated(dict(deprecated))
    query, key, value = (ops.convert_to_tensor(x) for x in (query, key, value))
    _check_tensors(query, key, value)
    check_number("scale", scale, allow_none=True)
    dropout_rate = as_rate("dropout_rate", dropout_rate)
    check_one_of("implementation", implementation, IMPLEMENTATIONS)
    check_positive_int("chunk_size", chunk_size, allow_none=True)
    check_positive_int("query_chunk_size", query_chunk_size, allow_none=True)
    check_number("soft_cap", soft_cap, 0, strict=True, allow_none=True)
    if flash_attention is not None:
        check_bool("flash_attention", flash_attention)
    if return_weights is not None:
        check_bool("return_weights", return_weights)
    for name, size, allowed in (("chunk_size", chunk_size, ("chunked", "linear")),
                                ("query_chunk_size", query_chunk_size, ("chunked",))):
        if size is not None and implementation not in allowed:
            raise ValueError(
                f"Argument `{name}` applies to implementation=" + " or ".join(
                    f'"{a}"' for a in allowed) + f" only. Received: {name}={size!r}, "
                f"implementation={implementation!r}"
            )
    if bias is not None:
        bias = check_bias(bias, query, key)
    if position_bias is not None and not isinstance(position_bias, PositionBias):
        raise ValueError(
            "Argument `position_bias` must be a keras_attn.ops.PositionBias (AlibiTileBias, "
            f"RelativeTileBias). Received: position_bias={position_bias!r}"
        )
    mask = as_attention_mask(mask, ops.shape(query)[-2], ops.shape(key)[-2], query.shape[0],
                             **loose)
    if mask is not None and mask.rank > len(query.shape):
        raise ValueError(
            f"Argument `mask` has a head axis (rank {mask.rank}) but the inputs have rank "
            f"{len(query.shape)}. Received: query.shape={tuple(query.shape)}"
        )
    if mask is not None:
        query, key, value = mask.hide_inputs(query, key, value)
    return attend(query, key, value, mask, scale=scale,
                  dropout_rate=dropout_rate if training else 0.0, seed=seed,
                  implementation=implementation, chunk_size=chunk_size,
                  query_chunk_size=query_chunk_size, bias=bias, position_bias=position_bias,
                  return_weights=return_weights, soft_cap=soft_cap,
                  flash_attention=flash_attention)
