"""The linear kernel: kernelized attention in O(n) time and memory (Katharopoulos et al., 2020).

With a positive feature map φ, attention becomes `φ(Q) (φ(K)ᵀ V) / (φ(Q) Σⱼ φ(Kⱼ))`: the
`(d, dv)` summary `φ(K)ᵀ V` is computed once, so no `(T, S)` matrix is ever formed. The causal
form uses prefix sums of `φ(kⱼ) vⱼᵀ`; to keep memory at O(n·d) rather than the O(n·d²) of a
cumulative sum per position, the prefix sums run over chunks of `chunk_size` positions, and
inside a chunk the (small) masked quadratic form is used. This is not softmax attention (no
scale, bias or dropout); the dispatch runs it as `implementation="linear"`.
"""

from __future__ import annotations

from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn.ops.dense_masks import causal_mask, merge_masks


def elu_feature_map(x):
    """φ(x) = elu(x) + 1, positive everywhere (the feature map of Katharopoulos et al.)."""
    return ops.elu(x) + 1.0


def _safe_divide(numerator, denominator):
    """`num / den` with 0 where `den == 0` (a query with no valid key), NaN-free gradients."""
    positive = ops.greater(denominator, 0.0)
    return ops.where(positive, numerator / ops.where(positive, denominator, 1.0), 0.0)


def _exclusive_cumsum(x):
    """Prefix sums over axis 2 that exclude the current position: `[0, x0, x0 + x1, ...]`."""
    padding = [[0, 0]] * len(x.shape)
    padding[2] = [1, 0]
    return ops.cumsum(ops.pad(x, padding)[:, :, :-1], axis=2)


def _causal_chunked(phi_q, phi_k, value, chunk_size: int):
    """Causal numerator and denominator by chunked prefix sums. Inputs `(B, H, T, ·)`."""
    seq_len = ops.shape(phi_q)[2]
    if isinstance(seq_len, int):
        chunk_size = max(1, min(chunk_size, seq_len))
    pad = (-seq_len) % chunk_size
    padding = [[0, 0], [0, 0], [0, pad], [0, 0]]
    # Padded keys have φ(k) = 0 and v = 0, so they add nothing to any sum.
    phi_q, phi_k, value = (ops.pad(x, padding) for x in (phi_q, phi_k, value))
    batch, heads, _, depth = ops.shape(phi_q)
    value_depth = ops.shape(value)[-1]
    qc = ops.reshape(phi_q, (batch, heads, -1, chunk_size, depth))  # (B, H, N, C, d)
    kc = ops.reshape(phi_k, (batch, heads, -1, chunk_size, depth))  # (B, H, N, C, d)
    vc = ops.reshape(value, (batch, heads, -1, chunk_size, value_depth))  # (B, H, N, C, dv)

    # Across chunks: the state before chunk n is Σ over earlier chunks (exclusive prefix sum).
    chunk_kv = ops.matmul(ops.swapaxes(kc, -1, -2), vc)  # (B, H, N, d, dv)
    chunk_k = ops.sum(kc, axis=3)  # (B, H, N, d)
    kv_before = _exclusive_cumsum(chunk_kv)  # (B, H, N, d, dv)
    k_before = _exclusive_cumsum(chunk_k)  # (B, H, N, d)
    numerator = ops.matmul(qc, kv_before)  # (B, H, N, C, dv)
    denominator = ops.sum(qc * ops.expand_dims(k_before, 3), axis=-1)  # (B, H, N, C)

    # Inside a chunk: the masked quadratic form on a C × C block.
    tril = ops.cast(causal_mask(chunk_size), qc.dtype)  # (C, C)
    scores = ops.matmul(qc, ops.swapaxes(kc, -1, -2)) * tril  # (B, H, N, C, C)
    numerator = numerator + ops.matmul(scores, vc)  # (B, H, N, C, dv)
    denominator = denominator + ops.sum(scores, axis=-1)  # (B, H, N, C)

    numerator = ops.reshape(numerator, (batch, heads, -1, value_depth))[:, :, :seq_len]
    denominator = ops.reshape(denominator, (batch, heads, -1))[:, :, :seq_len]
    return numerator, denominator  # (B, H, T, dv), (B, H, T)


def linear_attention(
    query,
    key,
    value,
    key_mask=None,
    causal: bool = False,
    chunk_size: int = 64,
    feature_map=elu_feature_map,
):
    """Kernelized attention `φ(Q)(φ(K)ᵀV) / φ(Q)Σφ(K)` in O(n) time and memory.

    Computed in float32 and cast back to the dtype of `value`.

    Args:
        query: `(B, H, T, d)`.
        key: `(B, H, S, d)`.
        value: `(B, H, S, dv)`.
        key_mask: optional boolean `(B, S)`, True = a valid key; padded keys get φ(k) = 0.
            Defaults to `None`.
        causal: bool, query `i` sees keys `j <= i` only (needs `T == S`). Defaults to `False`.
        chunk_size: int, chunk length of the causal prefix sums: memory
            O(T·chunk_size + T·d²/chunk_size). Defaults to `64`.
        feature_map: callable φ, must be non-negative. Defaults to `elu(x) + 1`.

    Returns:
        `(B, H, T, dv)`. A query with no valid key gets zeros (never NaN).

    Example:
    >>> q = k = v = keras.ops.ones((2, 4, 1000, 16))
    >>> linear_attention(q, k, v, causal=True).shape  # (2, 4, 1000, 16)
    """
    check_positive_int("chunk_size", chunk_size)
    out_dtype = value.dtype
    phi_q = feature_map(ops.cast(query, "float32"))  # (B, H, T, d)
    phi_k = feature_map(ops.cast(key, "float32"))  # (B, H, S, d)
    value = ops.cast(value, "float32")
    if key_mask is not None:
        keep = ops.cast(key_mask, "float32")[:, None, :, None]  # (B, 1, S, 1)
        phi_k = phi_k * keep
        value = value * keep  # so 0 · inf in a padded value cannot leak in
    if causal:
        q_len, k_len = query.shape[2], key.shape[2]
        if None not in (q_len, k_len) and q_len != k_len:
            raise ValueError(
                "Causal linear attention needs as many queries as keys. "
                f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
            )
        numerator, denominator = _causal_chunked(phi_q, phi_k, value, chunk_size)
    else:
        kv = ops.matmul(ops.swapaxes(phi_k, -1, -2), value)  # (B, H, d, dv)
        numerator = ops.matmul(phi_q, kv)  # (B, H, T, dv)
        denominator = ops.sum(phi_q * ops.sum(phi_k, axis=2, keepdims=True), axis=-1)  # (B,H,T)
    outputs = _safe_divide(numerator, ops.expand_dims(denominator, -1))  # (B, H, T, dv)
    return ops.cast(outputs, out_dtype)


def linear_attention_weights(query, key, key_mask=None, causal: bool = False,
                             feature_map=elu_feature_map):
    """The `(B, H, T, S)` weights that `linear_attention` applies implicitly (O(T·S): for
    inspection and heatmaps only). Rows with no valid key are zero."""
    phi_q = feature_map(ops.cast(query, "float32"))
    phi_k = feature_map(ops.cast(key, "float32"))
    scores = ops.matmul(phi_q, ops.swapaxes(phi_k, -1, -2))  # (B, H, T, S)
    mask = merge_masks(
        ops.shape(query)[2], ops.shape(key)[2], use_causal_mask=causal, key_mask=key_mask
    )
    if mask is not None:
        scores = scores * ops.cast(ops.expand_dims(mask, 1), "float32")  # (B, H, T, S)
    return _safe_divide(scores, ops.sum(scores, axis=-1, keepdims=True))
