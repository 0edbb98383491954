"""`attend`: the one seam between projected attention heads and the kernels.

An attention layer projects its inputs, builds one `AttentionMask`, zeroes what the mask hides
once (before projecting: `AttentionMask.hide_inputs`) and calls `attend`, which

- regroups grouped-query heads: queries `(B, H, T, d)` against keys and values
  `(B, H_kv, S, ·)` with `H_kv` dividing `H` run as `(B, H_kv, G, T, d)` against
  `(B, H_kv, 1, S, ·)`, per-head masks and biases alike, and come back as `(B, H, ·, ·)`;
- decides the kernel (`kernel_for`): the one asked for (`"auto"`: the one measured fastest on
  this backend and device, `keras_attn.tuning.AUTO_KERNELS`), except that the fused and local
  kernels give way to the dense one for what they cannot compute (same numbers);
- scales the queries, runs the kernel and gives padded queries zero outputs and weights.

| implementation | kernel | memory | weights | dropout | masks |
|---|---|---|---|---|---|
| `"dense"` | `kernels.dense` | `T · S` | yes | yes | all |
| `"chunked"` | `kernels.blockwise` | `T · chunk` | no | no | all, built per block |
| `"local"` | `kernels.local` | `T · window` | no (dense) | yes | a window, causality, key padding |
| `"linear"` | `kernels.linear` | `T · d²` | O(T · S) | no | causality, key padding |
| `"fused"` | `kernels.fused`: the backend's op | the op's | no (dense) | no (dense) | all |

`keras_attn.ops.dot_product_attention` is the same computation for callers of the op: it checks
its arguments, zeroes what the mask hides in them, and calls `attend`.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn import tuning
from keras_attn._checks import static_int
from keras_attn.ops.kernels.blockwise import blockwise_attention
from keras_attn.ops.kernels.common import lay_out, lead_shape
from keras_attn.ops.kernels.dense import dense_attention
from keras_attn.ops.kernels.fused import fused_attention, refusal
from keras_attn.ops.kernels.linear import linear_attention, linear_attention_weights
from keras_attn.ops.kernels.local import local_attention
from keras_attn.ops.masks import AttentionMask

# Every value of `implementation`, here and in every layer and model.
IMPLEMENTATIONS = ("dense", "chunked", "local", "linear", "fused", "auto")


def kernel_for(implementation: str, mask: AttentionMask | None, query, key, bias=None,
               return_weights: bool | None = None, *, value=None, position_bias=None,
               dropout_rate: float = 0.0, soft_cap: float | None = None,
               flash_attention: bool | None = None) -> str:
    """The kernel that runs for `implementation`: itself, except that

    - `"auto"` is the kernel `keras_attn.tuning.AUTO_KERNELS` measured fastest on this backend
      and device (`"fused"` or `"dense"`);
    - `"fused"` gives way to `"dense"` (same numbers) where the backend's op cannot compute the
      call exactly (`keras_attn.ops.kernels.fused.refusal`: returned weights, dropout, soft
      capping, ...), unless `flash_attention=True`, which raises a ValueError instead;
    - `"local"` gives way to `"dense"` where it cannot apply what the call asks: the returned
      weights, a bias tensor, a dense mask, per-query lengths, a causal offset (a decoding
      cache), soft capping, or keys that are not the queries' positions;
    - every kernel gives way to `"dense"` when there are no keys."""
    if flash_attention and implementation not in ("auto", "fused"):
        raise ValueError(
            "Argument `flash_attention=True` needs the backend's fused op: "
            "implementation=\"fused\" or \"auto\". Received: "
            f"implementation={implementation!r}"
        )
    if key.shape[-2] == 0:
        return "dense"
    if implementation == "auto":
        implementation = "fused" if flash_attention else tuning.auto_kernel(query)
    if implementation == "fused":
        reason = refusal(query, key, value, mask, bias, position_bias,
                         dropout_rate=dropout_rate, soft_cap=soft_cap,
                         return_weights=return_weights)
        if reason and flash_attention:
            raise ValueError(
                f"Argument `flash_attention=True` asks for the backend's fused op, which cannot "
                f"compute this call: {reason}. Use flash_attention=None."
            )
        return "dense" if reason else "fused"
    if implementation != "local" or mask is None or mask.window is None:
        return implementation
    q_len, k_len = query.shape[-2], key.shape[-2]
    offset = static_int(mask.offset)
    needs_scores = (
        bool(return_weights) or bias is not None or mask.dense is not None
        or soft_cap is not None
        or (mask.key_lens is not None and len(mask.key_lens.shape) == 2)
        or offset != 0 or (None not in (q_len, k_len) and q_len != k_len)
    )
    return "dense" if needs_scores else "local"


def query_groups(query, key) -> int:
    """Query heads per key/value head: `H // H_kv` for `(B, H, T, d)` queries against
    `(B, H_kv, S, d)` keys with `1 < H_kv < H`, else 1 (one head each, or heads shared by
    broadcasting)."""
    if len(query.shape) != 4 or len(key.shape) != 4:
        return 1
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads in (None, 1) or heads in (None, kv_heads):
        return 1
    if heads % kv_heads:
        raise ValueError(
            "Arguments `query` and `key` must have as many heads (axis 1), or `key` a number "
            f"of heads dividing the query's (grouped-query attention). Received: "
            f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    return heads // kv_heads


def _split_heads(x, heads: int, group: int, head_axis: int):
    """A per-head tensor with its `H` axis at `head_axis` split into `(H_kv, G)`; an axis of
    size 1 (shared by every head) becomes `(1, 1)`."""
    shape = tuple(ops.shape(x))
    if x.shape[head_axis] == 1:
        return ops.expand_dims(x, head_axis + 1)
    if x.shape[head_axis] != heads:
        return x
    return ops.reshape(x, shape[:head_axis] + (heads // group, group) + shape[head_axis + 1:])


def _regroup(query, key, value, mask, bias, group: int):
    """Queries `(B, H, T, d)` as `(B, H_kv, G, T, d)`, keys and values `(B, H_kv, 1, S, ·)`,
    a per-head dense mask `(B, H, T, S)` and bias (`(B|1, H, T, S)` or `(H, T, S)`) alike."""
    heads = query.shape[1]
    if mask is not None and mask.dense is not None and len(mask.dense.shape) == 4:
        mask = mask.with_dense(_split_heads(mask.dense, heads, group, 1))
    if bias is not None and len(bias.shape) in (3, 4) and bias.shape[-3] not in (None,):
        bias = _split_heads(bias, heads, group, len(bias.shape) - 3)
    return (_split_heads(query, heads, group, 1), ops.expand_dims(key, 2),
            ops.expand_dims(value, 2), mask, bias)


def _merge_groups(x, heads: int):
    """`(B, H_kv, G, T, ·)` -> `(B, H, T, ·)`."""
    if x is None:
        return None
    shape = tuple(ops.shape(x))
    return ops.reshape(x, shape[:1] + (heads,) + shape[3:])


def _expand_rows(valid, rank: int):
    """`(B, L)` boolean -> `(B, 1.., L, 1)` of rank `rank`."""
    valid = ops.expand_dims(valid, -1)
    while len(valid.shape) < rank:
        valid = ops.expand_dims(valid, 1)
    return valid


def weights_request(return_weights: bool, training) -> bool | None:
    """What a layer asks `attend` for (`return_weights`): True when its caller wants the
    weights; False (the dense kernel's fused backward pass, a custom gradient) where a gradient
    may be taken; None (the dense kernel's plain forward pass, the same numbers) where none is:
    `training=False`, or on TensorFlow `training=None` with no gradient tape recording (an
    export's trace, eager inference). The exporters need the plain pass: OpenVINO's converter
    makes a custom gradient's saved tensors extra outputs of the model."""
    if return_weights:
        return True
    if training is False:
        return None
    if training is None and keras.backend.backend() == "tensorflow":
        try:
            from tensorflow.python.eager import (
                record,  # not public API: without it, fused
            )
        except ImportError:
            return False
        return None if not record.could_possibly_record() else False
    return False


def attend(
    query,
    key,
    value,
    mask: AttentionMask | None = None,
    *,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    seed=None,
    implementation: str = "dense",
    chunk_size: int | None = None,
    query_chunk_size: int | None = None,
    bias=None,
    position_bias=None,
    return_weights: bool | None = None,
    soft_cap: float | None = None,
    flash_attention: bool | None = None,
):
    """`softmax(Q Kᵀ · scale + bias) V` (or linear attention) by the kernel `kernel_for` picks.

    The inputs are trusted: checked by the caller, and zero (or at least finite) where `mask`
    hides them everywhere (`AttentionMask.hide_inputs`).

    Args:
        query: `(B, H, T, d)` (or any `(..., T, d)` whose leading axes broadcast against the
            keys').
        key: `(B, H_kv, S, d)`, `H_kv` dividing `H` (grouped-query attention), or leading
            axes that broadcast.
        value: `(B, H_kv, S, dv)`.
        mask: optional `AttentionMask`; its `offset` places the position bias too.
        scale: multiplies the scores. Defaults to `1 / sqrt(d)` (unused by `"linear"`).
        dropout_rate: dropout on the weights, already 0 outside training.
        seed: int or `keras.random.SeedGenerator` for the dropout.
        implementation: one of `IMPLEMENTATIONS`. Defaults to `"dense"`.
        chunk_size: keys per block (`"chunked"`) or the causal prefix-sum chunk (`"linear"`,
            default 64).
        query_chunk_size: queries per block (`"chunked"`).
        bias: optional float bias broadcastable to the scores `(B, H, T, S)`; a bias
            `(H, T, S)` or `(B, H, T, S)` follows the query heads under grouping.
        position_bias: optional `keras_attn.ops.PositionBias` over the `H` query heads.
        return_weights: bool or None (return them when the dense kernel runs).
        soft_cap: optional float `c` > 0: the scaled scores become `c · tanh(scores / c)`
            before the bias and the mask (Gemma's attention logit soft-capping). Defaults to
            `None`.
        flash_attention: None, True or False, as Keras' `dot_product_attention` takes it: with
            `"fused"` or `"auto"`, None lets the backend choose its kernel, True asks for a
            flash kernel (a ValueError where the backend, the device or the call cannot have
            one), False for none. Defaults to `None`.

    Returns:
        `(outputs, weights)`: `(..., T, dv)` in the dtype of `value`, and `(..., T, S)` or
        None. Padded queries and queries that see no key get zero outputs and weights.
    """
    kernel = kernel_for(implementation, mask, query, key, bias, return_weights, value=value,
                        position_bias=position_bias, dropout_rate=dropout_rate,
                        soft_cap=soft_cap, flash_attention=flash_attention)
    if kernel == "fused":
        outputs = fused_attention(query, key, value, mask, bias, position_bias, scale,
                                  flash_attention)
        return _hide_padded_queries(outputs, None, mask)
    if kernel not in ("dense", "linear", "local") and return_weights:
        raise ValueError(
            "Returning the attention weights (the op's `return_weights=True`, a layer's "
            "`return_attention_scores=True`) needs the (T, S) weights, which "
            f"implementation={implementation!r} never forms; use implementation=\"dense\"."
        )
    if kernel == "chunked" and dropout_rate > 0.0:
        raise ValueError(
            "Argument `implementation=\"chunked\"` does not support dropout on the attention "
            "weights; use implementation=\"dense\" or no dropout. Received: "
            f"dropout_rate={dropout_rate}"
        )
    heads, rank = query.shape[1], len(query.shape)
    group = query_groups(query, key)
    if group > 1 and kernel in ("local", "linear"):
        # These kernels pair each query head with its own key head: share by repeating
        # (their memory is O(T), and their tiles stay within TensorFlow's softmax rank).
        key, value = ops.repeat(key, group, axis=1), ops.repeat(value, group, axis=1)
        group = 1
    if group > 1:
        query, key, value, mask, bias = _regroup(query, key, value, mask, bias, group)
    offset = 0 if mask is None else mask.offset
    weights = None
    if kernel == "linear":
        outputs, weights = _linear(query, key, value, mask, bias, position_bias, dropout_rate,
                                   scale, chunk_size, return_weights, soft_cap)
    else:
        if scale is None:
            scale = 1.0 / math.sqrt(query.shape[-1])
        # Scale the query before the product (fewer multiplications than scaling the scores).
        query = query * ops.cast(scale, query.dtype)
        if kernel == "dense":
            tile = None if mask is None else mask.block(rank=max(len(query.shape), mask.rank))
            if position_bias is not None:
                dense = lay_out(position_bias.dense(ops.shape(query)[-2], ops.shape(key)[-2],
                                                    offset), lead_shape(query, key))
                bias = dense if bias is None else ops.cast(bias, "float32") + dense
            outputs, weights = dense_attention(query, key, value, tile, bias, dropout_rate,
                                               seed, return_weights is not False, soft_cap)
        elif kernel == "chunked":
            outputs = blockwise_attention(query, key, value, mask, bias, chunk_size,
                                          query_chunk_size, position_bias, offset, soft_cap)
        else:
            outputs = local_attention(query, key, value, mask, dropout_rate, seed,
                                      position_bias)
    if len(outputs.shape) > rank:  # grouped heads back in one axis
        outputs, weights = _merge_groups(outputs, heads), _merge_groups(weights, heads)
    return _hide_padded_queries(outputs, weights, mask)


def _hide_padded_queries(outputs, weights, mask):
    """`(outputs, weights)` with zeros at the mask's padded queries (`query_valid`)."""
    query_valid = None if mask is None else mask.query_valid
    if query_valid is not None:
        rows = _expand_rows(query_valid, len(outputs.shape))  # (B, 1.., T, 1)
        outputs = ops.where(rows, outputs, ops.zeros_like(outputs))
        if weights is not None:
            weights = ops.where(rows, weights, ops.zeros_like(weights))
    return outputs, weights


def _linear(query, key, value, mask, bias, position_bias, dropout_rate, scale, chunk_size,
            return_weights, soft_cap=None):
    """The linear kernel (not softmax attention: no scale, bias, soft cap or dropout) on
    `(B, H, ·, ·)` heads (a `(B, L, ·)` input is one head)."""
    refused = [name for name, value_ in (("bias", bias), ("position_bias", position_bias),
                                         ("scale", scale), ("soft_cap", soft_cap))
               if value_ is not None]
    if dropout_rate > 0.0:
        refused.append("dropout_rate")
    if refused:
        raise ValueError(
            "implementation=\"linear\" is kernelized attention, φ(q)(φ(k)ᵀv) with "
            "φ(x) = elu(x) + 1: it has no scores to scale, bias or drop. Received: "
            + ", ".join(f"`{name}`" for name in refused)
        )
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 1) for x in (query, key, value))
    if len(query.shape) != 4:
        raise ValueError(
            "implementation=\"linear\" takes (batch, heads, length, dim) or (batch, length, "
            f"dim) inputs. Received: query.shape={tuple(query.shape)}"
        )
    key_padding, causal = None, False
    if mask is not None:
        key_padding = mask.key_padding("The linear kernel")
        causal = mask.causal
        if causal and static_int(mask.offset) != 0:
            raise ValueError(
                "The linear kernel takes no causal offset (no decoding cache). Received: "
                f"causal_offset={mask.offset!r}"
            )
    outputs = linear_attention(query, key, value, key_padding, causal,
                               64 if chunk_size is None else chunk_size)  # (B, H, T, dv)
    weights = None
    if return_weights:
        weights = ops.cast(linear_attention_weights(query, key, key_padding, causal),
                           value.dtype)  # (B, H, T, S)
    if single_head:
        outputs = ops.squeeze(outputs, 1)
        weights = None if weights is None else ops.squeeze(weights, 1)
    return outputs, weights
