"""Multi-head attention: h scaled dot-product heads computed as one batched product."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn import tuning
from keras_attn._checks import as_int, as_output_shape, warn_deprecated
from keras_attn.layers.any_rank import AnyRankInputs
from keras_attn.layers.base import BaseAttention
from keras_attn.layers.cache import KeyValueCache, as_cache_index
from keras_attn.layers.config import AttentionConfig
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.position_bias import (
    AlibiBias,
    RelativePositionBias,
    position_layer,
    serialize_position_layer,
)
from keras_attn.layers.position_encoding import RotaryEmbedding
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.ops.attention import check_bias
from keras_attn.ops.axes import check_axes_argument
from keras_attn.ops.dispatch import weights_request
from keras_attn.ops.heads import reshape_keeping_batch
from keras_attn.tuning import xla_dense

# What `MultiHead` takes as keywords besides its Keras arguments: the configuration's fields
# (Keras' `sliding_window`, `flash_attention`, `use_gate`, GroupQueryAttention's
# `num_key_value_heads`, and keras_attn's own).
ATTENTION_KEYWORDS = ("num_key_value_heads", "position_encoding", "implementation",
                      "chunk_size", "flash_attention", "sliding_window", "soft_cap", "use_gate",
                      "add_bias_kv", "add_zero_attn")


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHead(QuantizedSublayers, KeyValueCache, AnyRankInputs, BaseAttention):
    """Multi-head attention (Vaswani et al., 2017).

    Each head i computes softmax(Qᵢ Kᵢᵀ / √key_dim) Vᵢ with Qᵢ = q W_i^(q), Kᵢ = k W_i^(k),
    Vᵢ = v W_i^(v); the heads are concatenated and projected by W_o. The layer projects (one
    `keras.layers.Dense` per input, `query_dense` with `num_heads * key_dim` units), splits
    heads, keeps the decoding cache, and makes one call to `keras_attn.ops.attend`, which
    regroups grouped-query heads, picks the kernel and computes softmax(QKᵀ)V.

    A drop-in for `keras.layers.MultiHeadAttention` and `GroupQueryAttention` (see the README
    for the deliberate differences: `call(query, key, value)` order, boolean masks only, the
    query and value widths may differ), with torch's `kdim`/`vdim` (inputs of any widths),
    `add_bias_kv` (a learned key and value appended to the keys) and `add_zero_attn` (a zero
    key and value).

    Args:
        num_heads: int, number of query heads `H`.
        key_dim: int, size of each head for query and key (Llama's `head_dim`; independent of
            the input width).
        value_dim: int, size of each head for value. Defaults to `key_dim`.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        use_bias: bool, whether the projections have biases, or a collection of the names of
            those that do, among `"query"`, `"key"`, `"value"`, `"output"`, `"gate"` (Qwen2:
            `("query", "key", "value")`). Defaults to `True`.
        output_shape: optional int or tuple, the output's trailing shape. Defaults to the last
            dimension of the query.
        attention_axes: optional int or tuple, the axes of inputs of rank > 3 to attend over,
            as in Keras (negative axes count from the end; the softmax normalises jointly over
            the key's attention axes); `None` attends over every axis but the batch and the
            features. Defaults to `None`.
        kernel_initializer: initializer of the projection kernels; each projection draws from
            its own copy (`sublayer_initializer`). Defaults to `"glorot_uniform"`.
        bias_initializer: initializer of the projection biases. Defaults to `"zeros"`.
        kernel_regularizer, bias_regularizer, kernel_constraint, bias_constraint: of every
            projection. Default to `None`.
        seed: optional int seed for the dropout. Defaults to `None`.
        attention: optional `keras_attn.layers.AttentionConfig`, how the attention computes:
            grouped-query heads, positions, the kernel, the window, soft-capping, torch's extra
            keys. Its fields may also be given here as keywords, as Keras'
            `MultiHeadAttention` takes `sliding_window`, `flash_attention` and `use_gate` and
            `GroupQueryAttention` `num_key_value_heads`: `num_key_value_heads`,
            `position_encoding` (a name, or a `RotaryEmbedding` / `AlibiBias` /
            `RelativePositionBias` layer, which several attention layers may share, T5),
            `implementation` (`"dense"`; `"fused"`: the backend's fused op, torch's SDPA,
            JAX's `dot_product_attention`, Keras' op on TensorFlow; `"auto"`: the kernel
            measured fastest on this backend and device, `keras_attn.tuning.AUTO_KERNELS`;
            `"chunked"`: exact, memory `T · chunk_size`, no dropout in training, no returned
            weights; `"local"` with `sliding_window`; calls a kernel cannot take run the dense
            one, see `keras_attn.ops.kernel_for`), `chunk_size`, `flash_attention` (Keras'
            meaning, with `"fused"` or `"auto"`: True asks for a flash kernel, a ValueError
            where the backend, device or call cannot have one), `sliding_window` (the query at
            p sees the keys j with |p - j| < w; causal: the `w` latest), `soft_cap`,
            `use_gate`, `add_bias_kv`, `add_zero_attn`. A field given both ways must agree. Defaults to `None` (dense
            attention, one key/value head per query head, no positions).

    Call arguments:
        query: `(B, T, dq)`, or `(B, d_1, ..., d_n, dq)` with `attention_axes`.
        key: `(B, S, dk)`. Defaults to `query`.
        value: `(B, S, dv)`. Defaults to `key`.
        valid_lens: optional integer `(B,)` or `(B, T)` number of valid keys (rank-3 inputs).
        attention_mask: optional boolean `(B, T, S)` (or `(T, S)`, `(B, H, T, S)`; for inputs
            of rank > 3 the scores' layout as in Keras), True = attend. An additive float mask
            goes through `attention_bias`.
        use_causal_mask: bool, hide keys after each query. Defaults to `False`.
        return_attention_scores: bool, also return the weights `(B, H, T, S)` (Keras' layout
            `(B, others..., H, T..., S...)` for inputs of rank > 3).
        training: bool, whether dropout is active.
        query_mask, key_mask, value_mask: optional boolean padding masks of the inputs without
            their feature axis (default: the Keras implicit masks of the inputs).
        attention_bias: optional float tensor broadcastable to `(B, H, T, S)` (so `(H, T, S)`
            is per head), added to the scaled scores.
        cache: optional `(key_cache, value_cache)` of shapes `(B, H_kv, S_max, key_dim)` and
            `(B, H_kv, S_max, value_dim)` (see `init_cache` / `compute_cache`; a cache is
            trusted and not checked for padding again). With `cache_update_index=None` the
            cache is used as the keys and values (e.g. cross-attention to a fixed encoder;
            `key` and `value` must then be None); otherwise the projected `key`/`value` of
            this call are written into the cache at `cache_update_index` and attention runs
            over the whole cache under a causal mask offset by `cache_update_index` (implied:
            the slots after the queries are not written yet). Key masks then cover the whole
            cache, `(B, S_max)`.
        cache_update_index: int or scalar integer tensor, position of the first query in the
            cache.

    Returns:
        `(B, T, *output_shape)`; then the updated cache when `cache` is given; then the
        weights when `return_attention_scores=True`.

    Example:
    >>> mha = MultiHead(num_heads=2, key_dim=8)
    >>> x = keras.ops.ones((2, 5, 16))
    >>> out, weights = mha(x, return_attention_scores=True)  # (2, 5, 16), (2, 2, 5, 5)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed: int | None = None,
        attention: AttentionConfig | None = None,
        **kwargs,
    ):
        fields = {name: kwargs.pop(name) for name in ATTENTION_KEYWORDS if name in kwargs}
        output_dim = kwargs.pop("output_dim", None)
        if output_dim is not None:
            warn_deprecated("MultiHead: `output_dim=n` is `output_shape=n` (Keras' name) "
                            "(keras_attn 0.3 names, see CHANGELOG.md).")
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        self.num_heads = as_int("num_heads", num_heads)
        self.key_dim = as_int("key_dim", key_dim)
        self.value_dim = as_int("value_dim", value_dim, allow_none=True) or self.key_dim
        # A position layer given here is this layer's own (it may be shared with other
        # attention layers, T5); the configuration keeps its config.
        position = fields.get("position_encoding")
        self.config = AttentionConfig.merge(attention, num_heads=self.num_heads,
                                            use_bias=use_bias, **fields)
        if self.config.head_dim not in (None, self.key_dim):  # a block's, kept unchanged
            raise ValueError(
                "Argument `key_dim` and the `attention` configuration's `head_dim` disagree; "
                f"give it once. Received: key_dim={self.key_dim}, "
                f"attention.head_dim={self.config.head_dim}")
        self.config.check_dropout(dropout)
        self.check_implementation(self.config)
        self.output_dim, self.output_shape_ = as_output_shape(
            as_int("output_dim", output_dim, allow_none=True), output_shape)
        check_axes_argument(attention_axes)
        self.attention_axes = (tuple(attention_axes) if isinstance(attention_axes, (list, tuple))
                               else attention_axes)
        self.position_encoding = position_layer(
            position if isinstance(position, keras.layers.Layer)
            else self.config.position_encoding, self.dtype_policy)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)

    def check_implementation(self, config: AttentionConfig) -> None:
        """Subclasses refuse the kernels and options they cannot honour (none here)."""

    # The configuration's fields, as attributes.
    use_bias = property(lambda self: self.config.use_bias)
    implementation = property(lambda self: self.config.implementation)
    chunk_size = property(lambda self: self.config.chunk_size)
    sliding_window = property(lambda self: self.config.sliding_window)
    use_gate = property(lambda self: self.config.use_gate)
    flash_attention = property(lambda self: self.config.flash_attention)
    add_bias_kv = property(lambda self: self.config.add_bias_kv)
    add_zero_attn = property(lambda self: self.config.add_zero_attn)

    @property
    def num_key_value_heads(self) -> int:
        """Key/value heads: `H` unless grouped-query."""
        return self.config.num_key_value_heads or self.num_heads

    # ---- projections -----------------------------------------------------------------------

    def _dense(self, units: int, name: str, activation=None) -> keras.layers.Dense:
        """A projection `<name>_dense` with its own initializers (`sublayer_initializer`)."""
        sublayer = f"{name}_dense"
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias is True or (self.use_bias is not False
                                               and name in self.use_bias),
            kernel_initializer=sublayer_initializer(self.kernel_initializer, sublayer),
            bias_initializer=sublayer_initializer(self.bias_initializer, sublayer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            name=sublayer,
            dtype=self.dtype_policy,
        )

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        query_shape, key_shape, value_shape = (tuple(s) for s in (query_shape, key_shape,
                                                                   value_shape))
        value_width = self.num_heads * self.value_dim
        self.query_dense = self._dense(self.num_heads * self.key_dim, "query")
        self.key_dense = self._dense(self.num_key_value_heads * self.key_dim, "key")
        self.value_dense = self._dense(self.num_key_value_heads * self.value_dim, "value")
        out = math.prod(self.output_shape_) if self.output_shape_ else query_shape[-1]
        self.output_dense = self._dense(out, "output")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(query_shape[:-1] + (value_width,))
        if self.use_gate:
            self.gate_dense = self._dense(value_width, "gate", "sigmoid")
            self.gate_dense.build(query_shape)
        if (isinstance(self.position_encoding, RelativePositionBias)
                and not self.position_encoding.built):
            self.position_encoding.build((None, self.num_heads, None, None))
        if self.add_bias_kv:
            self.bias_k = self.add_weight(name="bias_k", initializer="zeros",
                                          shape=(self.num_key_value_heads * self.key_dim,))
            self.bias_v = self.add_weight(name="bias_v", initializer="zeros",
                                          shape=(self.num_key_value_heads * self.value_dim,))

    def split_heads(self, x, num_heads: int | None = None):
        """`(B, T, H · d)` -> `(B, H, T, d)` (`H` the query heads unless given)."""
        return attn_ops.split_heads(x, num_heads or self.num_heads)

    # ---- the call ------------------------------------------------------------------------------

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
        axes = self.axes_for(len(query.shape))
        if not axes.is_plain:
            return self._call_folded(axes, query, key, value, valid_lens, attention_mask,
                                     use_causal_mask, return_attention_scores, training,
                                     query_mask, key_mask, value_mask, attention_bias, cache)
        return self._call(query, key, value, valid_lens, attention_mask, use_causal_mask,
                          return_attention_scores, training, query_mask, key_mask, value_mask,
                          attention_bias, cache, cache_update_index)

    def _call(self, query, key, value, valid_lens, attention_mask, use_causal_mask,
              return_attention_scores, training, query_mask, key_mask, value_mask,
              attention_bias, cache, cache_update_index):
        """The call on `(B, T, d)` inputs: project, split heads, rotate, cache, attend once,
        combine heads."""
        if cache is not None:
            self.check_cache(cache, query, key, cache_update_index)
        offset = as_cache_index(0 if cache_update_index is None else cache_update_index)
        query, key, value, mask = self.prepare(
            query, key, value, valid_lens, attention_mask,
            use_causal_mask or cache_update_index is not None,  # a cache's later slots: unwritten
            query_mask, key_mask, value_mask,
            key_len=None if cache is None else ops.shape(cache[0])[2], causal_offset=offset,
            **self._window(),
        )
        if cache is None or cache_update_index is not None:  # this call's keys and values
            q, k, v = self._project_self(query, key, value, offset)
        else:  # keys and values of a cache as they are
            q, k, v = self._rotate(self.split_heads(xla_dense(self.query_dense, query)),
                                   offset), None, None
        if cache is not None:
            k, v = self.write_cache(cache, k, v, cache_update_index, offset)
        k_all, v_all, mask = self._append_extra_keys(k, v, mask)  # torch's options
        if attention_bias is not None:
            attention_bias = check_bias(attention_bias, q, k_all)
        context, weights = attn_ops.attend(
            q, k_all, v_all, mask, dropout_rate=self.dropout if training else 0.0,
            seed=self.seed_generator, implementation=self.implementation,
            chunk_size=self.chunk_size, bias=attention_bias,
            position_bias=self._position_bias(),
            return_weights=weights_request(return_attention_scores, training),
            soft_cap=self.config.soft_cap, flash_attention=self.config.flash_attention,
        )  # (B, H, T, dv), (B, H, T, S) or None
        results = (self._combine_heads(context, query),)
        if cache is not None:
            results += ((k, v),)
        if return_attention_scores:
            results += (weights,)
        return results[0] if len(results) == 1 else results

    def _project_self(self, query, key, value, offset):
        """This call's rotated queries `(B, H, T, dk)` and keys and values `(B, H_kv, S, ·)`;
        self-attention projects its one input by one product (`tuning.fused_dense`) and splits
        the heads with one transpose."""
        layers = (self.query_dense, self.key_dense, self.value_dense)
        if not (query is key and key is value and self.key_dim == self.value_dim
                and tuning.can_fuse(layers)):
            q = self._rotate(self.split_heads(xla_dense(self.query_dense, query)), offset)
            return (q,) + self.project_keys(key, value, offset)
        x = tuning.fused_dense(layers, query)  # (B, T, (H + 2 H_kv) · d)
        if self.num_key_value_heads == self.num_heads:
            # One transpose puts q, k, v first; splitting the first axis copies nothing.
            x = reshape_keeping_batch(x, (3, self.num_heads, self.key_dim))
            x = ops.transpose(x, (2, 0, 3, 1, 4))  # (3, B, H, T, d)
            q, k, v = (ops.squeeze(part, 0) for part in ops.split(x, 3, axis=0))  # (B, H, T, d)
        else:
            x = attn_ops.split_heads(x, self.num_heads + 2 * self.num_key_value_heads)
            q, k, v = ops.split(x, [self.num_heads, self.num_heads + self.num_key_value_heads],
                                axis=1)  # (B, H, T, d), (B, H_kv, T, d) twice
        return self._rotate(q, offset), self._rotate(k, offset), v

    def project_keys(self, key, value, start_index=0):
        """`(B, S, ·)` keys and values -> `(B, H_kv, S, key_dim)`, `(B, H_kv, S, value_dim)`,
        the keys rotated at positions `start_index + s` (with rotary positions)."""
        k = self.split_heads(xla_dense(self.key_dense, key), self.num_key_value_heads)
        v = self.split_heads(xla_dense(self.value_dense, value), self.num_key_value_heads)
        return self._rotate(k, start_index), v

    def _combine_heads(self, context, query):
        """`(B, H, T, dv)` -> the output `(B, T, *output_shape)`: heads merged, gated, projected."""
        context = attn_ops.merge_heads(context)  # (B, T, H · dv)
        if self.use_gate:
            context = context * self.gate_dense(query)
        outputs = xla_dense(self.output_dense, context)  # (B, T, prod(output_shape))
        if self.output_shape_ and len(self.output_shape_) > 1:
            outputs = ops.reshape(outputs, tuple(ops.shape(outputs)[:2]) + self.output_shape_)
        return outputs

    def _append_extra_keys(self, k, v, mask):
        """torch's `add_bias_kv` (a learned key and value) and `add_zero_attn` (a zero key and
        value) appended after the keys, visible to every query; no-op without them."""
        extras = []
        if self.add_bias_kv:
            extras.append((self.bias_k, self.bias_v))
        if self.add_zero_attn:
            extras.append((ops.zeros((self.num_key_value_heads * self.key_dim,)),
                           ops.zeros((self.num_key_value_heads * self.value_dim,))))
        for extra_k, extra_v in extras:
            k, v = _append_key(k, extra_k), _append_key(v, extra_v)
        if extras and mask is not None:
            mask = mask.append_keys(len(extras))
        return k, v, mask

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

    def _window(self) -> dict:
        """The sliding window as `AttentionMask.build` takes it (|p - j| <= window)."""
        return {} if self.sliding_window is None else {"window": self.sliding_window - 1}

    # ---- shapes and config ---------------------------------------------------------------------

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        return tuple(query_shape[:-1]) + (self.output_shape_ or (query_shape[-1],))

    def weights_shape(self, query_shape, key_shape) -> tuple:
        axes = self.axes_for(len(query_shape))
        if not axes.is_plain:
            return axes.weights_shape(query_shape, key_shape, self.num_heads)
        extra = int(self.add_bias_kv) + int(self.add_zero_attn)
        key_len = None if key_shape[1] is None else key_shape[1] + extra
        return (query_shape[0], self.num_heads, query_shape[1], key_len)

    def get_config(self):
        config = super().get_config()
        # The configuration once: its fields that are not Keras' arguments above.
        attention = {name: value for name, value in self.config.get_config().items()
                     if name not in ("num_heads", "head_dim", "use_bias")}
        if self.position_encoding is not None:
            attention["position_encoding"] = serialize_position_layer(self.position_encoding)
        config.update({
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "use_bias": self.use_bias if isinstance(self.use_bias, bool) else list(
                self.use_bias),
            "output_shape": None if self.output_shape_ is None else list(self.output_shape_),
            "attention_axes": (list(self.attention_axes)
                               if isinstance(self.attention_axes, tuple) else
                               self.attention_axes),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
            "attention": attention,
            "dtype": self.dtype_config(),
        })
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("output_shape") is not None:  # earlier releases saved both
            config.pop("output_dim", None)
        elif config.get("output_dim") is not None:
            config["output_shape"] = [config.pop("output_dim")]
        config.pop("output_dim", None)
        attention = config.get("attention")
        if isinstance(attention, dict) and isinstance(attention.get("position_encoding"), dict):
            # A position layer shared by several attention layers (T5) comes back as one
            # object: give it as this layer's own, not as a configuration to copy.
            attention = dict(attention)
            config["position_encoding"] = keras.saving.deserialize_keras_object(
                attention.pop("position_encoding"))
            config["attention"] = attention
        elif isinstance(config.get("position_encoding"), dict):
            config["position_encoding"] = keras.saving.deserialize_keras_object(
                config["position_encoding"])
        return cls(**config)

    # ---- importers (keras_attn.layers.importers) ---------------------------------------------

    @classmethod
    def from_keras(cls, layer, **kwargs) -> MultiHead:
        """A built `MultiHead` equal to a built `keras.layers.MultiHeadAttention` or
        `GroupQueryAttention`, its dtype policy and attention axes included; raises for the
        options it cannot reproduce exactly (see `keras_attn.layers.importers`)."""
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
    """`(B, H, S, d)` with one more position, `extra` `(H · d,)` broadcast over the batch."""
    extra = ops.reshape(ops.cast(extra, x.dtype), (1, ops.shape(x)[1], 1, ops.shape(x)[3]))
    extra = ops.broadcast_to(extra, ops.shape(x)[:2] + (1, ops.shape(x)[3]))  # (B, H, 1, d)
    return ops.concatenate([x, extra], axis=2)  # (B, H, S + 1, d)
