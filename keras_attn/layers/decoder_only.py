"""Decoder-only Transformers, the language models of GPT, LLaMA and T5's decoder without its
encoder: causal self-attention and a feed-forward network per block, a stack with token
embeddings, positions and vocabulary logits, and cached decoding one token at a time."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import check_bool, check_one_of
from keras_attn.layers.add_norm import make_norm
from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.position_encoding import (
    SinusoidalPositionEncoding,
    TokenAndPositionEmbedding,
)
from keras_attn.layers.transformer_blocks import (
    _check_embedded_shape,
    _get_activation,
    _head_dim,
    _TransformerBlock,
    serialize_activation,
)
from keras_attn.tokens import PAD_ID

POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "relative")


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderOnlyBlock(_TransformerBlock):
    """One decoder-only block: causal self-attention and a feed-forward network, no
    cross-attention.

    Pre-norm (`norm_first=True`, the default here, as in GPT-2 and LLaMA):
    `h = x + MultiHead(Norm(x), causal)`, `y = h + FFN(Norm(h))`; post-norm otherwise. With
    `norm="rms"`, `activation="swiglu"`, `position_encoding="rope"` and `num_key_value_heads`
    it is a LLaMA block.

    Args:
        As `TransformerEncoderBlock`; `norm_first` defaults to `True`.

    Call arguments:
        inputs: `(B, T, embed_dim)`.
        padding_mask: optional boolean `(B, T)`, True at real tokens (default: the implicit
            mask of `inputs`). Padded queries get a zero attention context.
        cache: optional `(key_cache, value_cache)`, each `(B, H_kv, max_length, head_dim)`
            (`init_cache`), with `cache_update_index`, the position of `inputs[:, 0]`.
        return_attention_scores: bool, also return the weights `(B, H, T, S)`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, embed_dim)`; then the updated cache when one was given; then the weights.

    Example:
    >>> block = TransformerDecoderOnlyBlock(num_heads=4, ffn_dim=64, position_encoding="rope")
    >>> block(keras.ops.ones((2, 5, 32))).shape  # (2, 5, 32)
    """

    def __init__(self, num_heads: int, ffn_dim: int, norm_first: bool = True, **kwargs):
        super().__init__(num_heads, ffn_dim, norm_first=norm_first, **kwargs)

    def build(self, inputs_shape):
        _check_embedded_shape("inputs", inputs_shape)
        embed_dim = inputs_shape[-1]
        self.self_attention = self._attention(embed_dim, "self_attention",
                                              self.attention_window, causal=True)
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention", inputs_shape)
        self.ffn = self._ffn(embed_dim, inputs_shape)
        self.ffn_norm = self._norm("ffn", inputs_shape)
        self._build_residual_dropout()

    def init_cache(self, batch_size, max_length: int):
        """An all-zero cache `(k, v)`, each `(B, H_kv, max_length, head_dim)`."""
        return self.self_attention.init_cache(batch_size, max_length)

    def call(self, inputs, padding_mask=None, cache=None, cache_update_index=None,
             return_attention_scores=False, training=None):
        if (cache is None) != (cache_update_index is None):
            raise ValueError(
                "Arguments `cache` and `cache_update_index` go together. Received: "
                f"cache_update_index={cache_update_index!r}"
            )
        if padding_mask is None:
            padding_mask = getattr(inputs, "_keras_mask", None)
        x = inputs  # (B, T, d)
        h = self._before(self.self_attention_norm, x)
        results = self.self_attention(
            h, query_mask=padding_mask, use_causal_mask=True, training=training, cache=cache,
            cache_update_index=cache_update_index,
            return_attention_scores=return_attention_scores,
        )  # (B, T, d) [, cache] [, (B, H, T, S)]
        results = results if isinstance(results, tuple) else (results,)
        x = self._after(self.self_attention_norm, x, results[0], training)
        h = self.ffn(self._before(self.ffn_norm, x), training=training)  # (B, T, d)
        outputs = self._after(self.ffn_norm, x, h, training)
        return outputs if len(results) == 1 else (outputs,) + results[1:]

    def compute_output_spec(self, inputs, padding_mask=None, cache=None,
                            cache_update_index=None, return_attention_scores=False,
                            training=None):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        results = (outputs,)
        if cache is not None:
            results += (tuple(keras.KerasTensor(c.shape, dtype=c.dtype) for c in cache),)
        if return_attention_scores:
            key_len = inputs.shape[1] if cache is None else cache[0].shape[2]
            results += (keras.KerasTensor((inputs.shape[0], self.num_heads, inputs.shape[1],
                                           key_len), dtype=self.compute_dtype),)
        return results[0] if len(results) == 1 else results


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderOnly(keras.layers.Layer):
    """A decoder-only Transformer: token embeddings, positions, N blocks, vocabulary logits.

    Positions (`position_encoding`): `"sinusoidal"` (embeddings · √d + the sinusoid table),
    `"learned"` (`TokenAndPositionEmbedding`, needs `max_length`), or `"rope"`, `"alibi"`,
    `"relative"` inside every block's attention. Token id 0 is padding. With
    `tie_embeddings=True` the vocabulary projection is the transposed token embedding. The
    logits are float32 under mixed precision.

    It implements the decoding contract of `keras_attn.decoding.generate`: `init_decode_state`
    preallocates one key/value cache per block, and `decode_step` runs tokens through the
    stack at a position, writing their keys and values into the caches in place.

    Args:
        vocab_size: int, number of tokens.
        num_layers: int, number of `TransformerDecoderOnlyBlock`s.
        embed_dim: int, model size `d`.
        num_heads: int, attention heads per block; must divide `embed_dim`.
        ffn_dim: int, hidden size of each block's FFN.
        dropout: float in [0, 1). Defaults to `0.0`.
        position_encoding: one of `"sinusoidal"`, `"learned"`, `"rope"`, `"alibi"`,
            `"relative"`. Defaults to `"rope"`.
        max_length: optional int, the positions `"learned"` embeds. Defaults to `None`.
        num_key_value_heads: optional int, grouped-query attention. Defaults to `None`.
        norm: `"layer"` or `"rms"`. Defaults to `"rms"`.
        activation: FFN activation, `"swiglu"` and `"geglu"` gated. Defaults to `"swiglu"`.
        norm_first: bool, pre-norm blocks and a final norm. Defaults to `True`.
        tie_embeddings: bool, logits from the token embedding. Defaults to `False`.
        kernel_initializer: initializer of the dense kernels. Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.

    Call arguments:
        inputs: integer token ids `(B, T)`, 0 = padding.
        return_attention_scores: bool, also return every block's weights. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        float32 logits `(B, T, vocab_size)` for the next token at every position; with
        `return_attention_scores=True` also the weights `(B, num_layers, num_heads, T, T)`.

    Example:
    >>> lm = TransformerDecoderOnly(100, num_layers=2, embed_dim=32, num_heads=4, ffn_dim=64)
    >>> lm(keras.ops.array([[2, 9, 4]])).shape  # (1, 3, 100)
    """

    def __init__(self, vocab_size: int, num_layers: int, embed_dim: int, num_heads: int,
                 ffn_dim: int, dropout: float = 0.0, position_encoding: str = "rope",
                 max_length: int | None = None, num_key_value_heads: int | None = None,
                 norm: str = "rms", activation="swiglu", norm_first: bool = True,
                 tie_embeddings: bool = False, kernel_initializer="glorot_uniform",
                 seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers),
                            ("embed_dim", embed_dim), ("num_heads", num_heads),
                            ("ffn_dim", ffn_dim)):
            check_positive_int(name, value)
        _head_dim(embed_dim, num_heads)
        check_rate("dropout", dropout)
        check_one_of("position_encoding", position_encoding, POSITIONS)
        check_positive_int("max_length", max_length, allow_none=position_encoding != "learned")
        check_bool("norm_first", norm_first)
        check_bool("tie_embeddings", tie_embeddings)
        self.vocab_size, self.num_layers, self.embed_dim = vocab_size, num_layers, embed_dim
        self.num_heads, self.ffn_dim, self.dropout = num_heads, ffn_dim, dropout
        self.position_encoding, self.max_length = position_encoding, max_length
        self.num_key_value_heads, self.norm = num_key_value_heads, norm
        self.activation = _get_activation(activation)
        self.norm_first, self.tie_embeddings = norm_first, tie_embeddings
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.blocks = [
            TransformerDecoderOnlyBlock(
                num_heads, ffn_dim, norm_first=norm_first, dropout=dropout,
                activation=self.activation, kernel_initializer=self.kernel_initializer,
                seed=seed, norm=norm, num_key_value_heads=num_key_value_heads,
                position_encoding=(position_encoding if position_encoding in
                                   ("rope", "alibi", "relative") else None),
                name=f"block_{i}", dtype=self.dtype_policy)
            for i in range(num_layers)
        ]

    def build(self, inputs_shape):
        if len(inputs_shape) != 2:
            raise ValueError(
                "Argument `inputs` must be integer token ids of shape (batch_size, seq_len). "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        embedded = tuple(inputs_shape) + (self.embed_dim,)
        if self.position_encoding == "learned":
            self.embedding = TokenAndPositionEmbedding(
                self.vocab_size, self.max_length, self.embed_dim, name="embedding",
                dtype=self.dtype_policy)
        else:
            self.embedding = keras.layers.Embedding(self.vocab_size, self.embed_dim,
                                                    name="embedding", dtype=self.dtype_policy)
        self.embedding.build(inputs_shape)
        self.sinusoid = None
        if self.position_encoding == "sinusoidal":
            self.sinusoid = SinusoidalPositionEncoding(dropout=self.dropout, seed=self.seed,
                                                       name="sinusoid", dtype=self.dtype_policy)
            self.sinusoid.build(embedded)
        for block in self.blocks:
            block.build(embedded)
        self.final_norm = None
        if self.norm_first:
            self.final_norm = make_norm(self.norm, 1e-5, "final_norm", self.dtype_policy)
            self.final_norm.build(embedded)
        self.output_dense = None
        if not self.tie_embeddings:
            self.output_dense = keras.layers.Dense(
                self.vocab_size, kernel_initializer=self.kernel_initializer,
                name="output_dense", dtype=self.dtype_policy)
            self.output_dense.build(embedded)

    def _embed(self, token_ids, start_index=0, training=None):
        """`(B, T)` ids at positions `start_index + t` -> `(B, T, d)`."""
        if self.position_encoding == "learned":
            return self.embedding(token_ids, start_index=start_index)
        x = self.embedding(token_ids)
        if self.sinusoid is not None:
            x = x * ops.cast(math.sqrt(self.embed_dim), x.dtype)
            x = self.sinusoid(x, start_index=start_index, training=training)
        return x

    def _logits(self, x):
        """float32 next-token logits of the final hidden states."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.tie_embeddings:
            table = self.embedding.token_embedding.embeddings if (
                self.position_encoding == "learned") else self.embedding.embeddings
            logits = ops.matmul(x, ops.transpose(ops.cast(table, x.dtype)))  # (B, T, V)
        else:
            logits = self.output_dense(x)
        return ops.cast(logits, "float32")

    def call(self, inputs, return_attention_scores=False, training=None):
        padding_mask = ops.not_equal(inputs, PAD_ID)  # (B, T)
        x = self._embed(inputs, training=training)
        weights = []
        for block in self.blocks:
            x, w = block(x, padding_mask=padding_mask, return_attention_scores=True,
                         training=training)
            weights.append(w)
        logits = self._logits(x)
        if return_attention_scores:
            return logits, ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, T, T)
        return logits

    # ---- the decoding contract of keras_attn.decoding.generate ----------------------------

    def init_decode_state(self, batch_size, max_length: int) -> dict:
        """`{"cache": one (k, v) per block}`, each `(B, H_kv, max_length, head_dim)`, zeros."""
        check_positive_int("max_length", max_length)
        if self.max_length is not None and max_length > self.max_length:
            raise ValueError(
                f"Argument `max_length` must be at most the model's max_length="
                f"{self.max_length}. Received: max_length={max_length}"
            )
        return {"cache": tuple(block.init_cache(batch_size, max_length)
                               for block in self.blocks)}

    def decode_step(self, token_ids, index, state: dict):
        """Run tokens at positions `index, index + 1, ...` through the stack and the caches.

        Args:
            token_ids: int `(B,)` (one token) or `(B, T)` (a prompt, at once).
            index: scalar int tensor (or int), the position of the first token.
            state: the dict of `init_decode_state` or of the previous call.

        Returns:
            `(logits, state, attention)`: float32 logits `(B, V)` predicting position
            `index + 1` (`(B, T, V)` for `(B, T)` tokens), the updated state, and the weights
            of the last token, float32 `(B, num_layers, num_heads, S)`.
        """
        single = len(token_ids.shape) == 1
        token_ids = ops.cast(token_ids, "int32")
        if single:
            token_ids = ops.expand_dims(token_ids, -1)  # (B, 1)
        x = self._embed(token_ids, start_index=index)  # (B, T, d)
        caches, weights = [], []
        for block, cache in zip(self.blocks, state["cache"]):
            x, cache, w = block(x, cache=cache, cache_update_index=index,
                                return_attention_scores=True)
            caches.append(cache)
            weights.append(w[:, :, -1, :])  # (B, H, S): the last token's
        logits = self._logits(x)  # (B, T, V)
        attention = ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, S)
        return (logits[:, 0] if single else logits), {"cache": tuple(caches)}, attention

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape) + (self.vocab_size,)

    def compute_output_spec(self, inputs, return_attention_scores=False, training=None):
        logits = keras.KerasTensor(tuple(inputs.shape) + (self.vocab_size,), dtype="float32")
        if not return_attention_scores:
            return logits
        weights = (inputs.shape[0], self.num_layers, self.num_heads, inputs.shape[1],
                   inputs.shape[1])
        return logits, keras.KerasTensor(weights, dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size, "num_layers": self.num_layers,
            "embed_dim": self.embed_dim, "num_heads": self.num_heads, "ffn_dim": self.ffn_dim,
            "dropout": self.dropout, "position_encoding": self.position_encoding,
            "max_length": self.max_length, "num_key_value_heads": self.num_key_value_heads,
            "norm": self.norm, "activation": serialize_activation(self.activation),
            "norm_first": self.norm_first, "tie_embeddings": self.tie_embeddings,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "seed": self.seed,
        })
        return config

