"""Multi-head attention: h scaled dot-product heads computed as one batched product."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import check_bool, check_one_of
from keras_attn.layers.base import BaseAttention, check_positive_int
from keras_attn.layers.cache import KeyValueCache
from keras_attn.layers.position_bias import (
    AlibiBias,
    RelativePositionBias,
    position_layer,
)
from keras_attn.layers.position_encoding import RotaryEmbedding
from keras_attn.tuning import xla_dense


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHead(KeyValueCache, BaseAttention):
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
        num_key_value_heads: optional int dividing `num_heads`: grouped-query attention, each
            key/value head serving `num_heads // num_key_value_heads` query heads (1 =
            multi-query). The cache holds only the key/value heads. Defaults to `None` (one
            per query head).
        position_encoding: `None`, `"rope"` (rotary embeddings of the projected queries and
            keys, offset by the cache index), `"alibi"` or `"relative"` (T5 buckets, learned),
            or a `RotaryEmbedding`, `AlibiBias` or `RelativePositionBias` layer. Biases are
            computed per block by the chunked kernel. Defaults to `None`.
        use_gate: bool, gate the attention output by `sigmoid(query W_g)` per head before the
            output projection (as `keras.layers.MultiHeadAttention(use_gate=True)`).
            Defaults to `False`.
        sliding_window: optional int, each query attends to keys within `sliding_window - 1`
            positions of it (as `keras.layers.MultiHeadAttention(sliding_window=...)`);
            `implementation="local"` then computes it in O(T · window). Defaults to `None`.
        output_shape: optional int or tuple, the output's trailing shape (Keras' name;
            `output_dim` for a single axis). Defaults to `None`.
        kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint: of every
            projection. Default to `None`.

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
        num_key_value_heads: int | None = None,
        position_encoding=None,
        use_gate: bool = False,
        sliding_window: int | None = None,
        output_shape=None,
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
        self.num_key_value_heads = num_key_value_heads or num_heads
        if num_heads % self.num_key_value_heads:
            raise ValueError(
                "Received an invalid value for argument `num_key_value_heads`, expected a "
                f"divisor of num_heads={num_heads}. Received: "
                f"num_key_value_heads={num_key_value_heads}"
            )
        check_positive_int("sliding_window", sliding_window, allow_none=True)
        check_bool("use_gate", use_gate)
        self.sliding_window = sliding_window
        self.use_gate = use_gate
        output_dim, self.output_shape_ = _output_shape(output_dim, output_shape)
        self.position_encoding = position_layer(position_encoding, self.dtype_policy)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_positive_int("chunk_size", chunk_size, allow_none=True)
        check_one_of("implementation", implementation, self.implementations
                     + (("local",) if sliding_window is not None else ()))
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

    def _dense(self, units: int, name: str, activation=None) -> keras.layers.Dense:
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
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
        heads_q = self.num_heads * self.key_dim
        heads_k = self.num_key_value_heads * self.key_dim
        heads_v = self.num_key_value_heads * self.value_dim
        self.query_dense = self._dense(heads_q, "query_dense")
        self.key_dense = self._dense(heads_k, "key_dense")
        self.value_dense = self._dense(heads_v, "value_dense")
        outputs = math.prod(self.output_shape_) if self.output_shape_ else query_shape[-1]
        self.output_dense = self._dense(outputs, "output_dense")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        if self.use_gate:
            self.gate_dense = self._dense(self.num_heads * self.value_dim, "gate_dense",
                                          "sigmoid")
            self.gate_dense.build(query_shape)
        if (isinstance(self.position_encoding, RelativePositionBias)
                and not self.position_encoding.built):
            self.position_encoding.build((None, self.num_heads, None, None))
        if self.add_bias_kv:
            self.bias_k = self.add_weight(name="bias_k", shape=(heads_k,), initializer="zeros")
            self.bias_v = self.add_weight(name="bias_v", shape=(heads_v,), initializer="zeros")

    def split_heads(self, x, num_heads: int | None = None):
        """`(B, T, H · d)` -> `(B, H, T, d)` (`H` the query heads unless given)."""
        return attn_ops.split_heads(x, num_heads or self.num_heads)

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
        offset = 0 if cache_update_index is None else cache_update_index
        q = self.split_heads(xla_dense(self.query_dense, query))  # (B, H, T, dk)
        q = self._rotate(q, offset)
        if cache is None:
            k, v = self.compute_cache(key, value)  # (B, H_kv, S, dk), (B, H_kv, S, dv)
            k = self._rotate(k, 0)
        else:
            k, v = cache
            if cache_update_index is not None:
                new_k, new_v = self.compute_cache(key, value)  # (B, H_kv, T, d)
                start = (0, 0, cache_update_index, 0)
                new_k = self._rotate(new_k, offset)  # the new keys sit at the queries' places
                k = ops.slice_update(k, start, ops.cast(new_k, k.dtype))
                v = ops.slice_update(v, start, ops.cast(new_v, v.dtype))
        k_att, v_att = k, v
        heads = (1, self.num_key_value_heads, 1, -1)
        if self.add_bias_kv:
            mask = self._append_mask(mask, ops.shape(k_att)[2])
            k_att = _append_key(k_att, ops.reshape(self.bias_k, heads))
            v_att = _append_key(v_att, ops.reshape(self.bias_v, heads))
        if self.add_zero_attn:
            mask = self._append_mask(mask, ops.shape(k_att)[2])
            k_att = _append_key(k_att, ops.zeros((1, 1, 1, self.key_dim), k_att.dtype))
            v_att = _append_key(v_att, ops.zeros((1, 1, 1, self.value_dim), v_att.dtype))
        q, k_att, v_att, mask, attention_bias = self._group(q, k_att, v_att, mask,
                                                           attention_bias)
        context, weights = attn_ops.dot_product_attention(
            q, k_att, v_att, mask, dropout_rate=self.dropout,
            training=bool(training), seed=self.seed_generator,
            implementation=implementation,
            chunk_size=self.chunk_size if implementation == "chunked" else None,
            bias=attention_bias, causal_offset=offset, position_bias=self._position_bias(),
            return_weights=bool(return_attention_scores),
            # The inputs were zeroed before projecting (`prepare`), the cache's too
            # (`compute_cache`): no per-step pass over the cache.
            zero_masked_inputs=False,
        )  # (B, H, T, dv) or (B, H_kv, G, T, dv); weights alike, or None
        context = self._ungroup(context)  # (B, H, T, dv)
        context = attn_ops.merge_heads(context)  # (B, T, H · dv)
        if self.use_gate:
            context = context * self.gate_dense(query)
        outputs = xla_dense(self.output_dense, context)  # (B, T, prod(output_shape))
        if self.output_shape_ and len(self.output_shape_) > 1:
            outputs = ops.reshape(outputs, tuple(ops.shape(outputs)[:2]) + self.output_shape_)
        results = (outputs,)
        if cache is not None:
            results += ((k, v),)
        if return_attention_scores:
            results += (self._ungroup(weights),)
        return results[0] if len(results) == 1 else results

    def _rotate(self, x, offset):
        """Rotary embeddings of `(B, H, T, d)` projections at positions `offset + t`."""
        if not isinstance(self.position_encoding, RotaryEmbedding):
            return x
        return self.position_encoding.rotate(x, offset, sequence_axis=2)

    def _position_bias(self):
        """The kernels' position bias, or None."""
        if isinstance(self.position_encoding, (AlibiBias, RelativePositionBias)):
            return self.position_encoding.position_bias(self.num_heads)
        return None

    def _group(self, q, k, v, mask, bias):
        """Grouped heads: `(B, H, T, d)` queries as `(B, H_kv, G, T, d)` against keys and values
        `(B, H_kv, 1, S, ·)`; per-head masks and biases alike. No-op without groups."""
        group = self.num_heads // self.num_key_value_heads
        if group == 1:
            return q, k, v, mask, bias

        def split(x):  # (B, H, ...) -> (B, H_kv, G, ...); a broadcast head axis stays 1
            if x is None or len(x.shape) < 4 or x.shape[1] == 1:
                return x if x is None or len(x.shape) < 4 else ops.expand_dims(x, 2)
            shape = tuple(ops.shape(x))
            return ops.reshape(x, shape[:1] + (self.num_key_value_heads, group) + shape[2:])

        if mask is not None and mask.dense is not None:
            mask = mask.with_dense(split(mask.dense))
        if bias is not None:
            bias = ops.convert_to_tensor(bias)
            bias = split(bias) if len(bias.shape) == 4 else bias
        return split(q), ops.expand_dims(k, 2), ops.expand_dims(v, 2), mask, bias

    def _ungroup(self, x):
        """`(B, H_kv, G, T, ·)` -> `(B, H, T, ·)`."""
        if x is None or len(x.shape) != 5:
            return x
        shape = tuple(ops.shape(x))
        return ops.reshape(x, shape[:1] + (self.num_heads,) + shape[3:])

    def _window(self) -> dict:
        """Extra `AttentionMask.build` arguments: the sliding window (Keras' `sliding_window`
        w is `|i - j| < w`, a window of `w - 1`)."""
        if self.sliding_window is None:
            return {}
        return {"window": self.sliding_window - 1}

    def _implementation(self, mask, return_attention_scores, cache, attention_bias) -> str:
        """The kernel for this call: the local kernel gives way to the dense one for what it
        cannot take (the weights, a cache, a bias tensor, a dense mask, per-query lengths)."""
        if self.implementation != "local":
            return self.implementation
        needs_scores = (
            return_attention_scores or cache is not None or attention_bias is not None
            or mask.dense is not None
            or (mask.key_lens is not None and len(mask.key_lens.shape) == 2)
        )
        return "dense" if needs_scores else "local"

    def _append_mask(self, mask, key_len):
        """The appended key is always visible (to every query that sees anything)."""
        if mask is None:
            return None
        return mask.append_keys(1)

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        return tuple(query_shape[:-1]) + (self.output_shape_ or (query_shape[-1],))

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
                "num_key_value_heads": (None if self.num_key_value_heads == self.num_heads
                                        else self.num_key_value_heads),
                "position_encoding": (None if self.position_encoding is None
                                      else keras.layers.serialize(self.position_encoding)),
                "use_gate": self.use_gate,
                "sliding_window": self.sliding_window,
                "output_shape": None if self.output_shape_ is None else list(self.output_shape_),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
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


def _output_shape(output_dim, output_shape):
    """`(output_dim, output_shape)`: the int of a one-axis output (else None) and the tuple
    (None when neither is given); both may be given when they agree."""
    if output_shape is not None:
        shape = (output_shape,) if isinstance(output_shape, int) else output_shape
        if not isinstance(shape, (tuple, list)) or not shape or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise ValueError(
                "Received an invalid value for argument `output_shape`, expected a positive "
                f"int or a tuple of them. Received: output_shape={output_shape!r}"
            )
        shape = tuple(shape)
        if output_dim is not None and shape != (output_dim,):
            raise ValueError(
                "Arguments `output_dim` and `output_shape` disagree; give one. Received: "
                f"output_dim={output_dim!r}, output_shape={output_shape!r}"
            )
        return (shape[0] if len(shape) == 1 else None), shape
    return output_dim, (None if output_dim is None else (output_dim,))


def _append_key(x, extra):
    """Concatenate one extra key position (broadcast over the batch) on axis 2."""
    extra = ops.cast(extra, x.dtype)
    extra = ops.broadcast_to(extra, ops.shape(x)[:2] + (1, ops.shape(x)[3]))  # (B, H, 1, d)
    return ops.concatenate([x, extra], axis=2)  # (B, H, S + 1, d)
