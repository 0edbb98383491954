"""The fused kernel: the backend's own attention op, with keras_attn's semantics kept on top.

`fused_attention` hands `softmax(q kᵀ · scale + bias) v` to the backend's fused op: torch's
`scaled_dot_product_attention` (SDPA: flash, memory-efficient or cuDNN kernels on a GPU, a
flash kernel on the CPU), JAX's `jax.nn.dot_product_attention` (XLA, or cuDNN on a GPU) and
Keras' `keras.ops.dot_product_attention` on TensorFlow (a composite of einsums). Torch takes the
`(B, H, T, d)` layout `attend` works in; JAX and Keras take `(B, T, H, d)`, so their inputs are
transposed in and the output back (XLA cancels the transposes of `split_heads` and
`merge_heads` against these).

What keras_attn promises on top of the op:

- a query that sees no key gets a zero output and zero gradients: such rows are given every key
  for the op (a finite average, never the NaN of a softmax over nothing, whatever the backend's
  kernel does with an empty row) and zeroed after;
- scores and softmax in float32 for 16-bit inputs: SDPA's CPU kernels and JAX's XLA path
  accumulate the scores and take the softmax in float32 (measured against the dense kernel in
  tests/test_fused_kernel.py); Keras' TensorFlow op forms the scores in the inputs' dtype, so
  float16 there (and a bias, which it casts to the inputs' dtype) is not sent (`refusal`);
- every mask of an `AttentionMask`: a causal mask alone (no offset, as many queries as keys)
  goes as the op's `is_causal` (no `(T, S)` tensor; torch's flash kernels need it that way), any
  other mask as one boolean block, per-query lengths, windows and cache offsets included;
- grouped-query heads as the op takes them (SDPA's `enable_gqa`, JAX's key/value heads);
  Keras' TensorFlow op repeats the key/value heads;
- a bias (and a position bias, added densely) in float32.

What it cannot express runs on keras_attn's own kernels (`refusal` says why, and
`keras_attn.ops.kernel_for` falls back): returned weights, dropout on the weights, logit
soft-capping, inputs that are not `(B, H, T, d)` or `(B, T, d)`, keys shared across the
batch.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import static_int
from keras_attn.ops.kernels.common import lay_out, lead_shape
from keras_attn.ops.masks import MASK_VALUE, AttentionMask

SIXTEEN_BIT = ("float16", "bfloat16")


def refusal(query, key, value=None, mask: AttentionMask | None = None, bias=None,
            position_bias=None, *, dropout_rate: float = 0.0, soft_cap=None,
            return_weights: bool | None = None) -> str | None:
    """Why the backend's fused op cannot compute this call exactly, or None when it can."""
    if return_weights:
        return "the attention weights are returned"
    if dropout_rate > 0.0:
        return "dropout on the attention weights"
    if soft_cap is not None:
        return ("logit soft-capping (Keras' op caps logits on JAX TPUs only, with the first "
                "sequence's mask for every sequence)")
    rank = len(query.shape)
    if rank not in (3, 4) or len(key.shape) != rank or (
            value is not None and len(value.shape) != rank):
        return f"inputs of rank {rank} (the op takes (batch, heads, length, dim))"
    if mask is not None and mask.rank > 4:
        return "a mask of rank 5"
    batches = {x.shape[0] for x in (query, key, value) if x is not None}
    if len(batches) > 1:
        return "keys or queries shared across the batch (a batch axis of size 1)"
    if rank == 4 and query.shape[1] != key.shape[1] and (
            None in (query.shape[1], key.shape[1]) or query.shape[1] % key.shape[1]):
        return "query heads that key/value heads do not divide"
    backend = keras.backend.backend()
    if backend == "jax" and value is not None and value.shape[-1] != key.shape[-1]:
        return "values of another width than the keys (JAX's op takes one head size)"
    dtype = keras.backend.standardize_dtype(query.dtype)
    if backend == "tensorflow" and dtype == "float16":
        return "float16 on TensorFlow (Keras' op forms the scores in float16, which overflow)"
    if backend == "tensorflow" and dtype in SIXTEEN_BIT and (
            bias is not None or position_bias is not None):
        return f"a bias with {dtype} inputs on TensorFlow (Keras' op casts it to {dtype})"
    return None


def flash_refusal(query, key, value, causal_only: bool, has_mask: bool,
                  has_bias: bool) -> str | None:
    """Why no flash kernel can run this call on this backend and device, or None."""
    backend = keras.backend.backend()
    dtype = keras.backend.standardize_dtype(query.dtype)
    if backend == "tensorflow":
        return "TensorFlow has no flash attention (Keras' op there is a composite)"
    from keras_attn import tuning

    device = tuning.device_kind(query)
    if device != "gpu":
        return f"no flash kernel on the {backend} {device}"
    if dtype not in SIXTEEN_BIT:
        return f"flash kernels take float16 or bfloat16 inputs, not {dtype}"
    if backend == "torch":
        if has_mask or has_bias:
            return "torch's flash kernel takes no mask or bias but a causal one (is_causal)"
        from torch.backends.cuda import SDPAParams, can_use_flash_attention

        gqa = key.shape[1] != query.shape[1]
        try:
            params = SDPAParams(query, key, value, None, 0.0, causal_only, gqa)
        except TypeError:  # torch < 2.5: no enable_gqa
            params = SDPAParams(query, key, value, None, 0.0, causal_only)
        if not can_use_flash_attention(params, False):
            return "torch's can_use_flash_attention refuses these shapes"
    if backend == "jax" and has_bias:
        return "JAX's cuDNN kernel is not given a float32 bias"
    return None


def causal_only(mask: AttentionMask | None, query, key) -> bool:
    """Whether the mask is causality alone, aligned at the first key with as many queries as
    keys: the ops' `is_causal`."""
    if mask is None or not mask.causal or static_int(mask.offset) != 0:
        return False
    if None in (query.shape[-2], key.shape[-2]) or query.shape[-2] != key.shape[-2]:
        return False
    return (mask.key_lens is None and mask.window is None and mask.dense is None
            and mask.key_valid is None and mask.true_key_len is None)


def _bias(bias, position_bias, query, key, offset):
    """The float32 bias `(B|1, H|1, T, S)` of a 4-D call (bias plus the dense position bias),
    or None."""
    if position_bias is not None:
        dense = lay_out(position_bias.dense(ops.shape(query)[-2], ops.shape(key)[-2], offset),
                        lead_shape(query, key))  # (1, H, T, S)
        bias = dense if bias is None else ops.cast(bias, "float32") + dense
    if bias is None:
        return None
    bias = ops.cast(bias, "float32")
    while len(bias.shape) < 4:
        bias = ops.expand_dims(bias, 0)
    return bias


def fused_attention(query, key, value, mask: AttentionMask | None = None, bias=None,
                    position_bias=None, scale: float | None = None,
                    flash_attention: bool | None = None):
    """`softmax(query keyᵀ · scale + bias) value` by the backend's fused op.

    Args:
        query: `(B, H, T, d)` or `(B, T, d)`, not scaled.
        key: `(B, H_kv, S, d)` (`H_kv` dividing `H`) or `(B, S, d)`.
        value: `(B, H_kv, S, dv)` or `(B, S, dv)`.
        mask: optional `AttentionMask`.
        bias: optional float bias broadcastable to `(B, H, T, S)` (`(B, T, S)` for 3-D inputs).
        position_bias: optional `keras_attn.ops.PositionBias` over the `H` query heads, placed
            by the mask's offset and added densely.
        scale: multiplies the scores. Defaults to `1 / sqrt(d)`.
        flash_attention: None (the backend's choice), True (a flash kernel or a ValueError),
            False (no flash kernel).

    Returns:
        `(B, H, T, dv)` (or `(B, T, dv)`) in the dtype of `value`; rows that see no key are
        zero.
    """
    single_head = len(query.shape) == 3
    if single_head:
        query, key, value = (ops.expand_dims(x, 1) for x in (query, key, value))
        if bias is not None and len(bias.shape) == 3:
            bias = ops.expand_dims(bias, 1)  # (B, T, S) -> (B, 1, T, S)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    bias = _bias(bias, position_bias, query, key, 0 if mask is None else mask.offset)
    backend = keras.backend.backend()
    # torch's SDPA takes `is_causal` or a mask tensor (a bias), not both.
    causal = causal_only(mask, query, key) and not (backend == "torch" and bias is not None)
    block = None if mask is None or causal else mask.block(rank=4)  # (B|1, H|1, T|1, S|1)
    has_keys = None
    if block is not None:
        has_keys = ops.any(block, axis=-1, keepdims=True)  # (B|1, H|1, T|1, 1)
        # A row that sees nothing gets every key (a finite average, zeroed below).
        block = ops.logical_or(block, ops.logical_not(has_keys))
    if flash_attention:
        reason = flash_refusal(query, key, value, causal, block is not None, bias is not None)
        if reason:
            raise ValueError(
                f"Argument `flash_attention=True` asks for a flash kernel, but {reason}. Use "
                "flash_attention=None (the backend's choice) or False. Received: "
                f"query.shape={tuple(query.shape)}, query.dtype="
                f"{keras.backend.standardize_dtype(query.dtype)}"
            )
    run = {"torch": _torch, "jax": _jax}.get(backend, _keras)
    outputs = run(query, key, value, block, bias, causal, scale, flash_attention)
    outputs = ops.cast(outputs, value.dtype)
    if has_keys is not None:
        outputs = ops.where(has_keys, outputs, ops.zeros_like(outputs))
    return ops.squeeze(outputs, 1) if single_head else outputs


def _torch(q, k, v, block, bias, causal, scale, flash):
    """torch's SDPA on `(B, H, T, d)`: one `attn_mask` (boolean, or the float32 bias with
    hidden entries at -1e30), grouped heads by `enable_gqa`."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    attn_mask = block
    if bias is not None:
        attn_mask = bias if block is None else torch.where(block, bias, MASK_VALUE)
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}

    def call():
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale, **gqa)

    if flash is None:
        return call()
    backends = ([SDPBackend.FLASH_ATTENTION] if flash
                else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    with sdpa_kernel(backends):
        return call()


def _jax(q, k, v, block, bias, causal, scale, flash):
    """`jax.nn.dot_product_attention` on `(B, T, H, d)`: XLA, or cuDNN where flash is asked
    for (and, with `flash=None`, tried first on a GPU for 16-bit inputs without a mask tensor
    or a bias)."""
    import jax

    from keras_attn import tuning

    q, k, v = (ops.swapaxes(x, 1, 2) for x in (q, k, v))  # (B, T|S, H, d)
    dtype = keras.backend.standardize_dtype(q.dtype)
    if dtype == "float16" and tuning.device_kind(q) == "cpu":
        # jax.nn asks XLA for float16 products summed in float32, which XLA on CPU compiles
        # nowhere inside `jax.jit` ("The precision 'F16_F16_F32' is not supported by
        # dot_general on CPU"; its fallback only catches the error op by op). Every float16 is
        # a float32: the same sums run in float32 and the output comes back in float16.
        q, k, v = (ops.cast(x, "float32") for x in (q, k, v))
        bias = None if bias is None else ops.cast(bias, "float32")

    def call(implementation):
        out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=block, scale=scale,
                                           is_causal=causal, implementation=implementation)
        return ops.swapaxes(ops.cast(out, dtype), 1, 2)  # (B, H, T, dv)

    if flash:
        return call("cudnn")
    # Unasked, cuDNN is tried only where it is known to apply (no mask tensor, no bias): its
    # refusals of other shapes may come when XLA compiles, past this `try`.
    if (flash is None and block is None and bias is None and tuning.device_kind(q) == "gpu"
            and keras.backend.standardize_dtype(q.dtype) in SIXTEEN_BIT):
        try:
            return call("cudnn")
        except Exception:  # noqa: BLE001, S110 - shapes cuDNN refuses: XLA computes the same
            pass
    return call("xla")


def _keras(q, k, v, block, bias, causal, scale, flash):
    """`keras.ops.dot_product_attention` (TensorFlow's composite) on `(B, T, H, d)`, key/value
    heads repeated for grouped queries."""
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = ops.repeat(k, group, axis=1), ops.repeat(v, group, axis=1)
    q, k, v = (ops.swapaxes(x, 1, 2) for x in (q, k, v))  # (B, T|S, H, d)
    out = ops.dot_product_attention(q, k, v, bias=bias, mask=block, scale=scale,
                                    is_causal=causal, flash_attention=flash)
    return ops.swapaxes(out, 1, 2)  # (B, H, T, dv)
