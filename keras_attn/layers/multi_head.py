"""Multi-head attention: h scaled dot-product heads computed as one batched product."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import check_bool
from keras_attn.chunked import fused_dot_product_attention, xla_barrier, xla_dense
from keras_attn.layers.base import BaseAttention, check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class MultiHead(BaseAttention):
    """Multi-head attention (Vaswani et al., 2017).

    Each head i computes softmax(Qᵢ Kᵢᵀ / √key_dim) Vᵢ with Qᵢ = q W_i^(q), Kᵢ = k W_i^(k),
    Vᵢ = v W_i^(v); the heads are concatenated and projected by W_o. The h heads share one
    projection per input (`query_dense` has `num_heads * key_dim` units) and run as a single
    batched matmul over a `(B, H, T, S)` score tensor, never a Python loop over heads.

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
        implementation: `"dense"` or `"chunked"`: exact attention blockwise over keys with an
            online softmax (`keras_attn.chunked`), memory `T · chunk_size` instead of `T · S`,
            same outputs and gradients. `valid_lens` and `use_causal_mask` are then built per
            block, never as `(T, S)`; it supports neither `dropout > 0` nor
            `return_attention_scores=True`. Defaults to `"dense"`.
        chunk_size: optional int, keys per block for `implementation="chunked"`; `None`
            sizes blocks to 2**25 scores per head (2048 keys at T = 16k). Defaults to `None`.

    Call arguments:
        query: `(B, T, dq)`.
        key: `(B, S, dk)`. Defaults to `query`.
        value: `(B, S, dv)`. Defaults to `key`.
        valid_lens: optional `(B,)` or `(B, T)` number of valid keys.
        attention_mask: optional boolean `(B, T, S)`, True = attend.
        use_causal_mask: bool, hide keys after each query. Defaults to `False`.
        return_attention_scores: bool, also return the weights `(B, H, T, S)`.
        training: bool, whether dropout is active.
        cache: optional `(key_cache, value_cache)` of shapes `(B, H, S_max, key_dim)` and
            `(B, H, S_max, value_dim)` (see `init_cache` / `compute_cache`). With
            `cache_update_index=None` the cache is used as the keys and values as it is (e.g.
            cross-attention to a fixed encoder); otherwise the projected `key`/`value` of this
            call are written into the cache at `cache_update_index` (a slice update, static
            shape) and attention runs over the whole cache. A causal mask is then offset by
            `cache_update_index`.
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
        check_positive_int("chunk_size", chunk_size, allow_none=True)
        if implementation not in ("dense", "chunked"):
            raise ValueError(
                "Received an invalid value for argument `implementation`, expected \"dense\" "
                f"or \"chunked\". Received: implementation={implementation!r}"
            )
        if implementation == "chunked" and dropout > 0:
            raise ValueError(
                "Argument `implementation=\"chunked\"` does not support dropout on the "
                "attention weights; use implementation=\"dense\" or dropout=0. Received: "
                f"implementation={implementation!r}, dropout={dropout!r}"
            )
        self.implementation = implementation
        self.chunk_size = chunk_size
        check_positive_int("key_dim", key_dim)
        check_positive_int("value_dim", value_dim, allow_none=True)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_bool("use_bias", use_bias)
        check_bool("add_bias_kv", add_bias_kv)
        check_bool("add_zero_attn", add_zero_attn)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = key_dim if value_dim is None else value_dim
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.add_bias_kv = add_bias_kv
        self.add_zero_attn = add_zero_attn
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

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
            if len(shape) != 3 or shape[-1] is None:
                raise ValueError(
                    f"Argument `{name}` must have shape (batch_size, length, dim) with a known "
                    f"dim. Received: {name}.shape={tuple(shape)}"
                )
        output_dim = self.output_dim or query_shape[-1]
        heads_k = self.num_heads * self.key_dim
        heads_v = self.num_heads * self.value_dim
        self.query_dense = self._dense(heads_k, "query_dense")
        self.key_dense = self._dense(heads_k, "key_dense")
        self.value_dense = self._dense(heads_v, "value_dense")
        self.output_dense = self._dense(output_dim, "output_dense")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (heads_v,))
        if self.add_bias_kv:
            self.bias_k = self.add_weight(name="bias_k", shape=(heads_k,), initializer="zeros")
            self.bias_v = self.add_weight(name="bias_v", shape=(heads_v,), initializer="zeros")

    # Under XLA the head split and merge are kept as transposes of their own (`xla_barrier`):
    # folded into the neighbouring products they make XLA's CPU kernels about 15% slower
    # (B32 T128 d256 h8 forward + backward, benchmarks/RESULTS.md). Elsewhere no-ops.

    def split_heads(self, x, depth: int):
        """`(B, T, H * depth)` -> `(B, H, T, depth)`."""
        x = ops.reshape(xla_barrier(x), ops.shape(x)[:-1] + (self.num_heads, depth))
        return xla_barrier(ops.transpose(x, (0, 2, 1, 3)))  # (B, H, T, depth)

    def merge_heads(self, x):
        """`(B, H, T, depth)` -> `(B, T, H * depth)`."""
        x = ops.transpose(x, (0, 2, 1, 3))  # (B, T, H, depth)
        shape = ops.shape(x)
        return xla_barrier(ops.reshape(x, shape[:2] + (shape[2] * shape[3],)))

    def compute_cache(self, key, value=None):
        """Project fixed keys/values once, e.g. the encoder outputs for cross-attention.

        Returns `(key_cache, value_cache)` of shapes `(B, H, S, key_dim)`, `(B, H, S, value_dim)`.
        """
        value = key if value is None else value
        return (
            self.split_heads(xla_dense(self.key_dense, key), self.key_dim),
            self.split_heads(xla_dense(self.value_dense, value), self.value_dim),
        )

    def init_cache(self, batch_size, max_length: int, dtype=None):
        """An all-zero self-attention cache of static length `max_length`."""
        dtype = dtype or self.compute_dtype
        return (
            ops.zeros((batch_size, self.num_heads, max_length, self.key_dim), dtype),
            ops.zeros((batch_size, self.num_heads, max_length, self.value_dim), dtype),
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
        cache=None,
        cache_update_index=None,
    ):
        if self.implementation == "chunked" and return_attention_scores:
            raise ValueError(
                "Argument `return_attention_scores=True` needs the (B, H, T, S) weights, which "
                "`implementation=\"chunked\"` never forms; use implementation=\"dense\". "
                "Received: return_attention_scores=True"
            )
        if cache is None:
            # The chunked path takes valid_lens and the causal mask unmerged and builds them per
            # block, never as (T, S); appended bias/zero keys need the merged mask.
            structured = self.implementation == "chunked" and not (
                self.add_bias_kv or self.add_zero_attn
            )
            # It also takes the query padding mask apart: a (B, T, 1) query mask merged with a
            # (B, 1, S) key mask would be a (B, T, S) tensor; the padded queries' outputs are
            # zeroed after attention instead, as the merged mask would have made them.
            key, value, mask = self.prepare(
                query, key, value, None if structured else valid_lens, attention_mask,
                use_causal_mask and not structured, query_mask, key_mask, value_mask,
                fold_query_mask=not structured,
            )
            outputs, weights = self.attend(
                query, key, value, mask, training, need_weights=return_attention_scores,
                valid_lens=valid_lens if structured else None,
                use_causal_mask=structured and use_causal_mask,
                query_mask=self.query_padding_mask(query, query_mask) if structured else None,
            )
            return (outputs, weights) if return_attention_scores else outputs
        if self.add_bias_kv or self.add_zero_attn:
            raise ValueError(
                "Argument `cache` cannot be combined with `add_bias_kv=True` or "
                "`add_zero_attn=True`."
            )
        key_cache, value_cache = cache
        if cache_update_index is not None:
            key = query if key is None else key
            value = key if value is None else value
            new_key, new_value = self.compute_cache(key, value)  # (B, H, T, d)
            start = (0, 0, cache_update_index, 0)
            key_cache = ops.slice_update(key_cache, start, ops.cast(new_key, key_cache.dtype))
            value_cache = ops.slice_update(
                value_cache, start, ops.cast(new_value, value_cache.dtype)
            )
        mask = attn_ops.merge_masks(
            ops.shape(query)[1],
            ops.shape(key_cache)[2],
            valid_lens=valid_lens,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_mask=query_mask,
            causal_offset=0 if cache_update_index is None else cache_update_index,
        )
        q = self.split_heads(xla_dense(self.query_dense, query), self.key_dim)  # (B, H, T, dk)
        outputs, weights = self._heads_attention(q, key_cache, value_cache, mask, training,
                                                 need_weights=return_attention_scores)
        if return_attention_scores:
            return outputs, (key_cache, value_cache), weights
        return outputs, (key_cache, value_cache)

    def attend(self, query, key, value, mask, training, need_weights=True, valid_lens=None,
               use_causal_mask=False, query_mask=None):
        q = self.split_heads(xla_dense(self.query_dense, query), self.key_dim)  # (B, H, T, dk)
        k = self.split_heads(xla_dense(self.key_dense, key), self.key_dim)  # (B, H, S, dk)
        v = self.split_heads(xla_dense(self.value_dense, value), self.value_dim)  # (B, H, S, dv)
        if self.add_bias_kv:
            mask = self._append_mask(mask, ops.shape(k)[2])
            k = self._append_key(k, ops.reshape(self.bias_k, (1, self.num_heads, 1, -1)))
            v = self._append_key(v, ops.reshape(self.bias_v, (1, self.num_heads, 1, -1)))
        if self.add_zero_attn:
            mask = self._append_mask(mask, ops.shape(k)[2])
            k = self._append_key(k, ops.zeros((1, 1, 1, self.key_dim), k.dtype))
            v = self._append_key(v, ops.zeros((1, 1, 1, self.value_dim), v.dtype))
        return self._heads_attention(q, k, v, mask, training, need_weights, valid_lens,
                                     use_causal_mask, query_mask)

    def _heads_attention(self, q, k, v, mask, training, need_weights=True, valid_lens=None,
                         use_causal_mask=False, query_mask=None):
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B, 1, T, S): shared by every head
        if self.implementation == "dense" and not need_weights:
            # The same dense attention with a fused backward (dS = P (dP - rowsum(dO O)), no
            # softmax Jacobian): fewer passes over (B, H, T, S), about 10-20% faster overall.
            # Its dropout draws the mask dot_product_attention would draw from the same seed.
            context = fused_dot_product_attention(
                q, k, v, mask=mask, valid_lens=valid_lens, causal=use_causal_mask,
                dropout_rate=self.dropout if bool(training) else 0.0, seed=self.seed_generator,
            )  # (B, H, T, dv)
            return xla_dense(self.output_dense, self.merge_heads(context)), None
        context, weights = attn_ops.dot_product_attention(
            q,
            k,
            v,
            mask=mask,
            dropout_rate=self.dropout,
            training=bool(training),
            seed=self.seed_generator,
            implementation=self.implementation,
            chunk_size=self.chunk_size,
            valid_lens=valid_lens,
            use_causal_mask=use_causal_mask,
        )  # (B, H, T, dv), (B, H, T, S) or None when chunked
        if query_mask is not None:
            # Padded queries attend to nothing: a zero context (and no gradient), as in dense.
            rows = ops.cast(query_mask, "bool")[:, None, :, None]  # (B, 1, T, 1)
            context = ops.where(rows, context, ops.zeros_like(context))
        return xla_dense(self.output_dense, self.merge_heads(context)), weights

    @staticmethod
    def _append_key(x, extra):
        """Concatenate one extra key position (broadcast over the batch) on axis 2."""
        extra = ops.cast(extra, x.dtype)
        extra = ops.broadcast_to(extra, ops.shape(x)[:2] + (1, ops.shape(x)[3]))  # (B, H, 1, d)
        return ops.concatenate([x, extra], axis=2)  # (B, H, S + 1, d)

    @staticmethod
    def _append_mask(mask, key_len):
        """The appended key is always visible. `mask` `(B, T, S)` or broadcastable to it (a
        query mask `(B, T, 1)` is first spread over the `key_len` keys)."""
        if mask is None:
            return None
        mask = ops.broadcast_to(mask, tuple(ops.shape(mask)[:-1]) + (key_len,))
        return ops.concatenate([mask, ops.ones_like(mask[..., :1])], axis=-1)

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
                "add_bias_kv": self.add_bias_kv,
                "add_zero_attn": self.add_zero_attn,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "implementation": self.implementation,
                "chunk_size": self.chunk_size,
            }
        )
        return config

    # ---- importers -----------------------------------------------------------------------

    @classmethod
    def from_keras(cls, layer: keras.layers.MultiHeadAttention, **kwargs) -> MultiHead:
        """A built `MultiHead` with the weights of a built `keras.layers.MultiHeadAttention`.

        Keras stores per-head kernels as `(in_dim, H, head_dim)`; they are flattened to
        `(in_dim, H * head_dim)`, which splits back into the same heads.
        """
        if not isinstance(layer, keras.layers.MultiHeadAttention) or not layer.built:
            raise ValueError(
                "Argument `layer` must be a built keras.layers.MultiHeadAttention. "
                f"Received: layer={layer!r}"
            )
        q_kernel = layer._query_dense.kernel
        out_kernel = layer._output_dense.kernel  # (H, dv, out)
        mha = cls(
            num_heads=layer.num_heads,
            key_dim=layer.key_dim,
            value_dim=layer.value_dim,
            output_dim=out_kernel.shape[-1],
            dropout=layer.dropout,
            use_bias=layer.use_bias,
            **kwargs,
        )
        mha.build(
            (None, None, q_kernel.shape[0]),
            (None, None, layer._key_dense.kernel.shape[0]),
            (None, None, layer._value_dense.kernel.shape[0]),
        )
        for ours, theirs in (
            (mha.query_dense, layer._query_dense),
            (mha.key_dense, layer._key_dense),
            (mha.value_dense, layer._value_dense),
            (mha.output_dense, layer._output_dense),
        ):
            weights = [ops.convert_to_numpy(w) for w in theirs.weights]
            ours.set_weights([np.reshape(w, ours_w.shape) for w, ours_w in
                              zip(weights, ours.weights)])
        return mha

    @classmethod
    def from_torch_state_dict(
        cls, state_dict, num_heads: int, add_zero_attn: bool = False, **kwargs
    ) -> MultiHead:
        """A built `MultiHead` equal to a `torch.nn.MultiheadAttention` with this state dict.

        Args:
            state_dict: mapping of names to arrays (NumPy arrays, or anything `np.asarray`
                accepts), as `module.state_dict()` gives them: `in_proj_weight` or
                `q_proj_weight`/`k_proj_weight`/`v_proj_weight`, optional `in_proj_bias`,
                `bias_k`, `bias_v`, `out_proj.weight`, optional `out_proj.bias`.
            num_heads: int, the torch module's `num_heads`.
            add_zero_attn: bool, the torch module's `add_zero_attn` (it has no weight, so the
                state dict cannot tell). Defaults to `False`.
            **kwargs: further `MultiHead` arguments, e.g. `dropout`.

        torch computes `x Wᵀ + b`, so each kernel is the transposed torch weight.
        """
        sd = {k: np.asarray(v, dtype="float32") for k, v in state_dict.items()}
        if "out_proj.weight" not in sd:
            raise ValueError(
                "Argument `state_dict` has no `out_proj.weight`. "
                f"Received keys: {sorted(sd)}"
            )
        embed_dim = sd["out_proj.weight"].shape[0]
        check_positive_int("num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(
                f"Argument `num_heads` must divide embed_dim={embed_dim}. "
                f"Received: num_heads={num_heads}"
            )
        if "in_proj_weight" in sd:
            w_q, w_k, w_v = np.split(sd["in_proj_weight"], 3, axis=0)
        else:
            w_q, w_k, w_v = (sd[f"{n}_proj_weight"] for n in "qkv")
        use_bias = "in_proj_bias" in sd
        mha = cls(
            num_heads=num_heads,
            key_dim=embed_dim // num_heads,
            output_dim=embed_dim,
            use_bias=use_bias,
            add_bias_kv="bias_k" in sd,
            add_zero_attn=add_zero_attn,
            **kwargs,
        )
        mha.build((None, None, w_q.shape[1]), (None, None, w_k.shape[1]),
                  (None, None, w_v.shape[1]))
        biases = np.split(sd["in_proj_bias"], 3) if use_bias else [None] * 3
        for dense, w, b in zip((mha.query_dense, mha.key_dense, mha.value_dense),
                               (w_q, w_k, w_v), biases):
            dense.set_weights([w.T] if b is None else [w.T, b])
        out_w = [sd["out_proj.weight"].T]
        if use_bias:
            out_w.append(sd["out_proj.bias"])
        mha.output_dense.set_weights(out_w)
        if mha.add_bias_kv:
            mha.bias_k.assign(sd["bias_k"].reshape(-1))
            mha.bias_v.assign(sd["bias_v"].reshape(-1))
        return mha
