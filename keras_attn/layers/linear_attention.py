"""Linear attention as a layer: kernelized attention in O(n) time and memory.

The kernel is `keras_attn.ops.linear_attention` (Katharopoulos et al., 2020), reached through
the same seam as every kernel: `keras_attn.ops.attend(..., implementation="linear")`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import as_int, check_bool
from keras_attn.layers.base import BaseAttention
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers


@keras.saving.register_keras_serializable(package="keras_attn")
class LinearAttention(QuantizedSublayers, BaseAttention):
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
        kernel_initializer: initializer of the projection kernels, each projection drawing
            from its own copy (`sublayer_initializer`). Defaults to `"glorot_uniform"`.
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
        num_heads, key_dim = as_int("num_heads", num_heads), as_int("key_dim", key_dim)
        value_dim = as_int("value_dim", value_dim, allow_none=True)
        output_dim = as_int("output_dim", output_dim, allow_none=True)
        chunk_size = as_int("chunk_size", chunk_size)
        check_bool("use_bias", use_bias)
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
            if shape[-1] is None:
                raise ValueError(
                    f"Argument `{name}` must have a known last dimension. "
                    f"Received: {name}.shape={tuple(shape)}"
                )
        heads_k = self.num_heads * self.key_dim
        heads_v = self.num_heads * self.value_dim

        def dense(units, name):
            return keras.layers.Dense(
                units, use_bias=self.use_bias, name=name, dtype=self.dtype_policy,
                kernel_initializer=sublayer_initializer(self.kernel_initializer, name),
                bias_initializer=sublayer_initializer(self.bias_initializer, name))

        self.query_dense = dense(heads_k, "query_dense")
        self.key_dense = dense(heads_k, "key_dense")
        self.value_dense = dense(heads_v, "value_dense")
        self.output_dense = dense(self.output_dim or query_shape[-1], "output_dense")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (heads_v,))

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
        query, key, value, mask = self.prepare(
            query, key, value, valid_lens, attention_mask, use_causal_mask, query_mask,
            key_mask, value_mask,
        )
        q = attn_ops.split_heads(self.query_dense(query), self.num_heads)  # (B, H, T, dk)
        k = attn_ops.split_heads(self.key_dense(key), self.num_heads)  # (B, H, S, dk)
        v = attn_ops.split_heads(self.value_dense(value), self.num_heads)  # (B, H, S, dv)
        context, weights = attn_ops.attend(q, k, v, mask, implementation="linear",
                                           chunk_size=self.chunk_size,
                                           return_weights=bool(return_attention_scores))
        outputs = self.output_dense(attn_ops.merge_heads(context))  # (B, T, output_dim)
        if not return_attention_scores:
            return outputs
        return outputs, ops.cast(weights, outputs.dtype)

    def weights_shape(self, query_shape, key_shape) -> tuple:
        return (query_shape[0], self.num_heads, query_shape[1], key_shape[1])

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
                "dtype": self.dtype_config(),
            }
        )
        return config
