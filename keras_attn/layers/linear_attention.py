"""Linear attention: kernelized attention in O(n) time and memory (Katharopoulos et al., 2020).

With a positive feature map φ, attention becomes `φ(Q) (φ(K)ᵀ V) / (φ(Q) Σⱼ φ(Kⱼ))`: the
`(d, dv)` summary `φ(K)ᵀ V` is computed once, so no `(T, S)` matrix is ever formed. The causal
form uses prefix sums of `φ(kⱼ) vⱼᵀ`; to keep memory at O(n·d) rather than the O(n·d²) of a
cumulative sum per position, the prefix sums run over chunks of `chunk_size` positions, and
inside a chunk the (small) masked quadratic form is used.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn.layers.base import BaseAttention, check_positive_int


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
    tril = ops.cast(attn_ops.causal_mask(chunk_size), qc.dtype)  # (C, C)
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
    mask = attn_ops.merge_masks(
        ops.shape(query)[2], ops.shape(key)[2], use_causal_mask=causal, key_mask=key_mask
    )
    if mask is not None:
        scores = scores * ops.cast(ops.expand_dims(mask, 1), "float32")  # (B, H, T, S)
    return _safe_divide(scores, ops.sum(scores, axis=-1, keepdims=True))


def padding_masks(query, key, value, valid_lens, attention_mask, query_mask, key_mask,
                  value_mask, layer_name: str):
    """Resolve defaults and padding masks for attention that never forms a `(T, S)` mask.

    Returns `(key, value, query_mask, key_mask)`: boolean `(B, T)` and `(B, S)` masks or None.
    Raises ValueError for the masks that would need the `(T, S)` matrix: `attention_mask` and
    per-query `valid_lens` of shape `(B, T)`.
    """
    if attention_mask is not None:
        raise ValueError(
            f"Argument `attention_mask` is not supported by {layer_name}, which never forms "
            "the (query_len, key_len) matrix; use `valid_lens`, key padding masks or "
            f"`use_causal_mask`. Received: attention_mask.shape={tuple(attention_mask.shape)}"
        )
    self_attention = key is None
    key = query if key is None else key
    value = key if value is None else value
    if query_mask is None:
        query_mask = getattr(query, "_keras_mask", None)
    if self_attention:
        key_mask = query_mask
    elif key_mask is None:
        key_mask = value_mask if value_mask is not None else getattr(key, "_keras_mask", None)
    if valid_lens is not None:
        valid_lens = ops.convert_to_tensor(valid_lens)
        if len(valid_lens.shape) != 1:
            raise ValueError(
                f"Argument `valid_lens` must have shape (batch_size,) for {layer_name}. "
                f"Received: valid_lens.shape={tuple(valid_lens.shape)}"
            )
        lens_mask = attn_ops.sequence_mask(valid_lens, ops.shape(key)[1])  # (B, S)
        key_mask = lens_mask if key_mask is None else ops.logical_and(
            ops.cast(key_mask, "bool"), lens_mask
        )
    if key_mask is not None:
        key_mask = ops.cast(key_mask, "bool")
    if query_mask is not None:
        query_mask = ops.cast(query_mask, "bool")
    return key, value, query_mask, key_mask


@keras.saving.register_keras_serializable(package="keras_attn")
class LinearAttention(BaseAttention):
    """Multi-head linear attention (Katharopoulos et al., 2020): O(n) time and memory.

    Each head computes `φ(Qᵢ)(φ(Kᵢ)ᵀVᵢ) / φ(Qᵢ)Σⱼφ(Kᵢⱼ)` with φ(x) = elu(x) + 1 instead of
    `softmax(QᵢKᵢᵀ/√d)Vᵢ`; projections and head split are those of `MultiHead`
    (`query_dense`, `key_dense`, `value_dense`, `output_dense`). Padded keys get φ(k) = 0.
    `use_causal_mask=True` uses chunked prefix sums (see `linear_attention`).

    Masks that need the full `(T, S)` matrix (`attention_mask`, `(B, T)` valid_lens) raise
    a ValueError. `return_attention_scores=True` additionally forms the implicit `(B, H, T, S)`
    weights, which costs O(T·S): use it for inspection only.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each head for query and key.
        value_dim: int, size of each head for value. Defaults to `key_dim`.
        output_dim: int, size of the output. Defaults to the last dimension of the query.
        use_bias: bool, whether the projections have biases. Defaults to `True`.
        chunk_size: int, chunk length of the causal prefix sums. Defaults to `64`.
        kernel_initializer: initializer of the projection kernels. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of the projection biases. Defaults to `"zeros"`.

    Call arguments:
        query: `(B, T, dq)`.
        key: `(B, S, dk)`. Defaults to `query`.
        value: `(B, S, dv)`. Defaults to `key`.
        valid_lens: optional `(B,)` number of valid keys.
        use_causal_mask: bool, query `i` sees keys `j <= i`. Defaults to `False`.
        return_attention_scores: bool, also return the implicit weights `(B, H, T, S)`.
        training: unused (no dropout), accepted for the common signature.

    Returns:
        `(B, T, output_dim)`; padded queries get a zero context (so the output bias only).

    Example:
    >>> layer = LinearAttention(num_heads=2, key_dim=8)
    >>> layer(keras.ops.ones((2, 4096, 16)), use_causal_mask=True).shape  # (2, 4096, 16)

    References:
        Katharopoulos et al., 2020, "Transformers are RNNs: Fast Autoregressive Transformers
        with Linear Attention", https://arxiv.org/abs/2006.16236
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        output_dim: int | None = None,
        use_bias: bool = True,
        chunk_size: int = 64,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_positive_int("chunk_size", chunk_size)
        if not isinstance(use_bias, bool):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Received an invalid value for argument `use_bias`, expected a bool. "
                f"Received: use_bias={use_bias!r}"
            )
        if self.dropout:
            raise ValueError(
                "Received an invalid value for argument `dropout`: LinearAttention has no "
                f"attention weights to drop. Received: dropout={self.dropout!r}"
            )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = key_dim if value_dim is None else value_dim
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.chunk_size = chunk_size
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape)):
            if len(shape) != 3 or shape[-1] is None:
                raise ValueError(
                    f"Argument `{name}` must have shape (batch_size, length, dim) with a known "
                    f"dim. Received: {name}.shape={tuple(shape)}"
                )
        heads_k = self.num_heads * self.key_dim
        heads_v = self.num_heads * self.value_dim
        dense = {
            "use_bias": self.use_bias,
            "kernel_initializer": self.kernel_initializer,
            "bias_initializer": self.bias_initializer,
            "dtype": self.dtype_policy,
        }
        self.query_dense = keras.layers.Dense(heads_k, name="query_dense", **dense)
        self.key_dense = keras.layers.Dense(heads_k, name="key_dense", **dense)
        self.value_dense = keras.layers.Dense(heads_v, name="value_dense", **dense)
        self.output_dense = keras.layers.Dense(
            self.output_dim or query_shape[-1], name="output_dense", **dense
        )
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (heads_v,))

    def _split_heads(self, x, depth: int):
        x = ops.reshape(x, ops.shape(x)[:-1] + (self.num_heads, depth))  # (B, T, H, depth)
        return ops.transpose(x, (0, 2, 1, 3))  # (B, H, T, depth)

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
    ):
        key, value, query_mask, key_mask = padding_masks(
            query, key, value, valid_lens, attention_mask, query_mask, key_mask, value_mask,
            "LinearAttention",
        )
        q = self._split_heads(self.query_dense(query), self.key_dim)  # (B, H, T, dk)
        k = self._split_heads(self.key_dense(key), self.key_dim)  # (B, H, S, dk)
        v = self._split_heads(self.value_dense(value), self.value_dim)  # (B, H, S, dv)
        context = linear_attention(q, k, v, key_mask, bool(use_causal_mask), self.chunk_size)
        if query_mask is not None:
            context = context * ops.cast(query_mask, context.dtype)[:, None, :, None]
        context = ops.transpose(context, (0, 2, 1, 3))  # (B, T, H, dv)
        shape = ops.shape(context)
        context = ops.reshape(context, shape[:2] + (shape[2] * shape[3],))  # (B, T, H * dv)
        outputs = self.output_dense(context)  # (B, T, output_dim)
        if not return_attention_scores:
            return outputs
        weights = linear_attention_weights(q, k, key_mask, bool(use_causal_mask))
        if query_mask is not None:
            weights = weights * ops.cast(query_mask, weights.dtype)[:, None, :, None]
        return outputs, weights

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "chunk_size": self.chunk_size,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
