"""Multi-head attention: h scaled dot-product heads computed as one batched product."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import check_bool, check_one_of, concrete_value
from keras_attn.layers.base import BaseAttention, check_positive_int
from keras_attn.tuning import xla_dense


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHead(BaseAttention):
    """Multi-head attention (Vaswani et al., 2017).

    Each head i computes softmax(Qᵢ Kᵢᵀ / √key_dim) Vᵢ with Qᵢ = q W_i^(q), Kᵢ = k W_i^(k),
    Vᵢ = v W_i^(v); the heads are concatenated and projected by W_o. The h heads share one
    projection per input (`query_dense` has `num_heads * key_dim` units) and run as a single
    batched product over `(B, H, T, S)` scores, through `keras_attn.ops.dot_product_attention`.

    Keys and values may have sizes different from the query (torch's `kdim`/`vdim`).
    `add_bias_kv` appends a learned key and value to the key sequence and `add_zero_attn` a zero
    key and value, as `torch.nn.MultiheadAttention` documents them.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each head for query and key.
        value_dim: int, size of each head for value. Defaults to `key_dim`.
        output_dim: int, size of the output. Defaults to the last dimension of the query.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        use_bias: bool, whether the four projections have biases. Defaults to `True`.
        add_bias_kv: bool, append learned biases to the keys and values. Defaults to `False`.
        add_zero_attn: bool, append a zero key and value. Defaults to `False`.
        kernel_initializer: initializer of the projection kernels. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of the projection biases. Defaults to `"zeros"`.
        seed: optional int seed for the dropout. Defaults to `None`.
        implementation: `"dense"` or `"chunked"` (exact attention blockwise over keys, memory
            `T · chunk_size` instead of `T · S`, same outputs and gradients; no dropout in
            training, no returned weights). See `keras_attn.ops.dot_product_attention`.
            Defaults to `"dense"`.
        chunk_size: optional int, keys per block for `implementation="chunked"`; `None` sizes
            blocks by `keras_attn.tuning`. Defaults to `None`.

    Call arguments:
        query: `(B, T, dq)`.
        key: `(B, S, dk)`. Defaults to `query`.
        value: `(B, S, dv)`. Defaults to `key`.
        valid_lens: optional integer `(B,)` or `(B, T)` number of valid keys.
        attention_mask: optional boolean `(B, T, S)` (or `(T, S)`, `(B, H, T, S)`), True =
            attend. An additive float mask goes through `attention_bias`.
        use_causal_mask: bool, hide keys after each query. Defaults to `False`.
        return_attention_scores: bool, also return the weights `(B, H, T, S)`.
        training: bool, whether dropout is active.
        query_mask, key_mask, value_mask: optional boolean `(B, T)`, `(B, S)`, `(B, S)`
            padding masks (default: the Keras implicit masks of the inputs).
        attention_bias: optional float tensor broadcastable to `(B, H, T, S)`, added to the
            scaled scores.
        cache: optional `(key_cache, value_cache)` of shapes `(B, H, S_max, key_dim)` and
            `(B, H, S_max, value_dim)` (see `init_cache` / `compute_cache`, which zeroes padded
            positions; a cache is trusted and not checked for them again). With
            `cache_update_index=None` the cache is used as the keys and values (e.g.
            cross-attention to a fixed encoder; `key` and `value` must then be None);
            otherwise the projected `key`/`value` of this call are written into the cache at
            `cache_update_index` and attention runs over the whole cache, a causal mask
            offset by `cache_update_index`. Key masks then cover the whole cache, `(B, S_max)`.
        cache_update_index: int or scalar tensor, position of the first query in the cache.

    Returns:
        `(B, T, output_dim)`; then the updated cache when `cache` is given; then the weights
        `(B, H, T, S)` when `return_attention_scores=True`.

    Example:
    >>> mha = MultiHead(num_heads=2, key_dim=8)
    >>> x = keras.ops.ones((2, 5, 16))
    >>> out, weights = mha(x, return_attention_scores=True)  # (2, 5, 16), (2, 2, 5, 5)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    implementations = ("dense", "chunked")

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        output_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed: int | None = None,
        implementation: str = "dense",
        chunk_size: int | None = None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_positive_int("chunk_size", chunk_size, allow_none=True)
        check_one_of("implementation", implementation, self.implementations)
        check_bool("use_bias", use_bias)
        check_bool("add_bias_kv", add_bias_kv)
        check_bool("add_zero_attn", add_zero_attn)
        if chunk_size is not None and implementation != "chunked":
            raise ValueError(
                "Argument `chunk_size` applies to implementation=\"chunked\" only. Received: "
                f"chunk_size={chunk_size!r}, implementation={implementation!r}"
            )
        if implementation == "chunked" and dropout > 0:
            raise ValueError(
                "Argument `implementation=\"chunked\"` does not support dropout on the "
                "attention weights; use implementation=\"dense\" or dropout=0. Received: "
                f"implementation={implementation!r}, dropout={dropout!r}"
            )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = key_dim if value_dim is None else value_dim
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.add_bias_kv = add_bias_kv
        self.add_zero_attn = add_zero_attn
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.implementation = implementation
        self.chunk_size = chunk_size

    def _dense(self, units: int, name: str) -> keras.layers.Dense:
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            name=name,
            dtype=self.dtype_policy,
        )

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
        self.query_dense = self._dense(heads_k, "query_dense")
        self.key_dense = self._dense(heads_k, "key_dense")
        self.value_dense = self._dense(heads_v, "value_dense")
        self.output_dense = self._dense(self.output_dim or query_shape[-1], "output_dense")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (heads_v,))
        if self.add_bias_kv:
            self.bias_k = self.add_weight(name="bias_k", shape=(heads_k,), initializer="zeros")
            self.bias_v = self.add_weight(name="bias_v", shape=(heads_v,), initializer="zeros")

    def split_heads(self, x):
        """`(B, T, H · d)` -> `(B, H, T, d)`."""
        return attn_ops.split_heads(x, self.num_heads)

    def compute_cache(self, key, value=None, key_mask=None):
        """Project fixed keys/values once, e.g. the encoder outputs for cross-attention.

        Args:
            key: `(B, S, dk)`.
            value: `(B, S, dv)`. Defaults to `key`.
            key_mask: optional boolean `(B, S)`, False at padded keys: those positions are
                zeroed before projecting, so a non-finite number there cannot reach the
                outputs of later calls (which trust the cache and do not check it again).
                Defaults to the implicit mask of `key`.

        Returns:
            `(key_cache, value_cache)` of shapes `(B, H, S, key_dim)`, `(B, H, S, value_dim)`.
        """
        value = key if value is None else value
        key_mask = getattr(key, "_keras_mask", None) if key_mask is None else key_mask
        if key_mask is not None:
            keep = ops.expand_dims(ops.cast(key_mask, "bool"), -1)  # (B, S, 1)
            key = ops.where(keep, key, ops.zeros_like(key))
            value = ops.where(keep, value, ops.zeros_like(value))
        return (self.split_heads(xla_dense(self.key_dense, key)),
                self.split_heads(xla_dense(self.value_dense, value)))

    def init_cache(self, batch_size, max_length: int, dtype=None):
        """An all-zero self-attention cache of static length `max_length`."""
        check_positive_int("max_length", max_length)
        dtype = dtype or self.compute_dtype
        return (
            ops.zeros((batch_size, self.num_heads, max_length, self.key_dim), dtype),
            ops.zeros((batch_size, self.num_heads, max_length, self.value_dim), dtype),
        )

    def _check_cache(self, cache, query, key, cache_update_index):
        """The cache is a pair of `(B, H, S_max, ·)` tensors matching the query's batch, and
        the update index fits it."""
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise ValueError(
                "Argument `cache` must be a pair (key_cache, value_cache). "
                f"Received: cache={type(cache).__name__}"
            )
        key_cache, value_cache = cache
        for name, tensor, depth in (("key_cache", key_cache, self.key_dim),
                                    ("value_cache", value_cache, self.value_dim)):
            expected = (query.shape[0], self.num_heads, key_cache.shape[2], depth)
            shape = tuple(tensor.shape)
            if len(shape) != 4 or any(None not in (got, want) and got != want
                                      for got, want in zip(shape, expected)):
                raise ValueError(
                    f"Argument `cache` must hold {name} of shape (batch_size={query.shape[0]}, "
                    f"num_heads={self.num_heads}, max_length, {depth}) for this query. Received: "
                    f"{name}.shape={shape}"
                )
        if cache_update_index is None:
            if key is not None:
                raise ValueError(
                    "Arguments `key` and `value` must be None when `cache` is used as the keys "
                    "and values (cache_update_index=None). Received: key.shape="
                    f"{tuple(key.shape)}"
                )
            return
        index = concrete_value(cache_update_index)
        length, max_length = query.shape[1], key_cache.shape[2]
        if index is not None and index.ndim != 0:
            raise ValueError(
                "Argument `cache_update_index` must be a scalar. Received: "
                f"cache_update_index.shape={index.shape}"
            )
        if index is not None and None not in (length, max_length) and not (
                0 <= int(index) <= max_length - length):
            raise ValueError(
                f"Argument `cache_update_index` must place the {length} new keys inside the cache "
                f"of length {max_length}, in [0, {max_length - length}]. Received: "
                f"cache_update_index={int(index)}"
            )

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
        attention_bias=None,
        cache=None,
        cache_update_index=None,
    ):
        key_len = None
        if cache is not None:
            if self.add_bias_kv or self.add_zero_attn:
                raise ValueError(
                    "Argument `cache` cannot be combined with `add_bias_kv=True` or "
                    "`add_zero_attn=True`."
                )
            self._check_cache(cache, query, key, cache_update_index)
            key_len = ops.shape(cache[0])[2]
        query, key, value, mask = self.prepare(
            query, key, value, valid_lens, attention_mask, use_causal_mask, query_mask,
            key_mask, value_mask, key_len=key_len,
            causal_offset=0 if cache_update_index is None else cache_update_index,
            **self._window(),
        )
        implementation = self._implementation(mask, return_attention_scores, cache,
                                              attention_bias)
        if return_attention_scores and implementation != "dense":
            raise ValueError(
                "Argument `return_attention_scores=True` needs the (B, H, T, S) weights, which "
                f"implementation={implementation!r} never forms; use implementation=\"dense\"."
            )
        q = self.split_heads(xla_dense(self.query_dense, query))  # (B, H, T, dk)
        if cache is None:
            k, v = self.compute_cache(key, value)  # (B, H, S, dk), (B, H, S, dv)
        else:
            k, v = cache
            if cache_update_index is not None:
                new_k, new_v = self.compute_cache(key, value)  # (B, H, T, d)
                start = (0, 0, cache_update_index, 0)
                k = ops.slice_update(k, start, ops.cast(new_k, k.dtype))
                v = ops.slice_update(v, start, ops.cast(new_v, v.dtype))
        k_att, v_att = k, v
        if self.add_bias_kv:
            mask = self._append_mask(mask, ops.shape(k_att)[2])
            k_att = _append_key(k_att, ops.reshape(self.bias_k, (1, self.num_heads, 1, -1)))
            v_att = _append_key(v_att, ops.reshape(self.bias_v, (1, self.num_heads, 1, -1)))
        if self.add_zero_attn:
            mask = self._append_mask(mask, ops.shape(k_att)[2])
            k_att = _append_key(k_att, ops.zeros((1, 1, 1, self.key_dim), k_att.dtype))
            v_att = _append_key(v_att, ops.zeros((1, 1, 1, self.value_dim), v_att.dtype))
        context, weights = attn_ops.dot_product_attention(
            q, k_att, v_att, mask, dropout_rate=self.dropout,
            training=bool(training), seed=self.seed_generator,
            implementation=implementation,
            chunk_size=self.chunk_size if implementation == "chunked" else None,
            bias=attention_bias,
            return_weights=bool(return_attention_scores),
            # The inputs were zeroed before projecting (`prepare`), the cache's too
            # (`compute_cache`): no per-step pass over the cache.
            zero_masked_inputs=False,
        )  # (B, H, T, dv), (B, H, T, S) or None
        outputs = xla_dense(self.output_dense, attn_ops.merge_heads(context))
        results = (outputs,)
        if cache is not None:
            results += ((k, v),)
        if return_attention_scores:
            results += (weights,)
        return results[0] if len(results) == 1 else results

    def _window(self) -> dict:
        """Extra `AttentionMask.build` arguments: a sliding window in subclasses."""
        return {}

    def _implementation(self, mask, return_attention_scores, cache, attention_bias) -> str:
        """The kernel for this call."""
        return self.implementation

    def _append_mask(self, mask, key_len):
        """The appended key is always visible (to every query that sees anything)."""
        if mask is None:
            return None
        return mask.append_keys(1)

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def weights_shape(self, query_shape, key_shape) -> tuple:
        extra = int(self.add_bias_kv) + int(self.add_zero_attn)
        key_len = None if key_shape[1] is None else key_shape[1] + extra
        return (query_shape[0], self.num_heads, query_shape[1], key_len)

    def compute_output_spec(self, *args, **kwargs):
        spec = super().compute_output_spec(*args, **kwargs)
        cache = kwargs.get("cache")
        if cache is None:
            return spec
        cache_spec = tuple(keras.KerasTensor(c.shape, dtype=c.dtype) for c in cache)
        if isinstance(spec, tuple):
            return spec[0], cache_spec, spec[1]
        return spec, cache_spec

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "add_bias_kv": self.add_bias_kv,
                "add_zero_attn": self.add_zero_attn,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "implementation": self.implementation,
                "chunk_size": self.chunk_size,
            }
        )
        return config

    # ---- importers (keras_attn.layers.importers) ---------------------------------------------

    @classmethod
    def from_keras(cls, layer, **kwargs) -> MultiHead:
        """A built `MultiHead` equal to a built `keras.layers.MultiHeadAttention`; raises for
        the options it cannot reproduce exactly (see `keras_attn.layers.importers`)."""
        from keras_attn.layers.importers import from_keras

        return from_keras(cls, layer, **kwargs)

    @classmethod
    def from_torch_state_dict(cls, state_dict, num_heads: int, add_zero_attn: bool = False,
                              **kwargs) -> MultiHead:
        """A built `MultiHead` equal to a `torch.nn.MultiheadAttention` with this state dict
        (see `keras_attn.layers.importers`)."""
        from keras_attn.layers.importers import from_torch_state_dict

        return from_torch_state_dict(cls, state_dict, num_heads, add_zero_attn, **kwargs)


def _append_key(x, extra):
    """Concatenate one extra key position (broadcast over the batch) on axis 2."""
    extra = ops.cast(extra, x.dtype)
    extra = ops.broadcast_to(extra, ops.shape(x)[:2] + (1, ops.shape(x)[3]))  # (B, H, 1, d)
    return ops.concatenate([x, extra], axis=2)  # (B, H, S + 1, d)
