"""Transformer encoder and decoder stacks, and one-token-at-a-time cached decoding.

The stacks add the token embedding scaled by √d, the sinusoidal position encoding and dropout
to a sequence of blocks (`keras_attn.layers.transformer_blocks`); the decoder stack ends in the
vocabulary projection and implements the decoding contract of `keras_attn.decoding`
(`init_decode_state` / `decode_step`) over a static-shape key/value cache.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import check_bool
from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.transformer_blocks import (
    TransformerDecoderBlock,
    TransformerEncoderBlock,
    _get_activation,
    _head_dim,
    serialize_activation,
)
from keras_attn.tokens import PAD_ID


class _TransformerStack(keras.layers.Layer):
    """What the encoder and decoder stacks share: arguments, embedding, config."""

    def __init__(
        self,
        vocab_size: int,
        num_layers: int,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation="relu",
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        attention_window: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("attention_window", attention_window, allow_none=True)
        self.attention_window = attention_window
        for name, value in (
            ("vocab_size", vocab_size),
            ("num_layers", num_layers),
            ("embed_dim", embed_dim),
            ("num_heads", num_heads),
            ("ffn_dim", ffn_dim),
        ):
            check_positive_int(name, value)
        _head_dim(embed_dim, num_heads)
        check_rate("dropout", dropout)
        check_bool("norm_first", norm_first)
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ffn_dim = ffn_dim
        self.dropout = dropout
        self.norm_first = norm_first
        self.activation = _get_activation(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed

    def _check_ids_shape(self, name: str, shape) -> None:
        if len(shape) != 2:
            raise ValueError(
                f"Argument `{name}` must be integer token ids of shape (batch_size, seq_len). "
                f"Received: {name}.shape={tuple(shape)}"
            )

    def _block_kwargs(self) -> dict:
        return {
            "num_heads": self.num_heads,
            "ffn_dim": self.ffn_dim,
            "dropout": self.dropout,
            "norm_first": self.norm_first,
            "activation": self.activation,
            "kernel_initializer": self.kernel_initializer,
            "seed": self.seed,
            "attention_window": self.attention_window,
            "dtype": self.dtype_policy,
        }

    def _build_embedding(self, ids_shape, input_dim: int | None = None) -> None:
        """Token embedding (`input_dim` rows, default `vocab_size`), positions, final norm."""
        self.token_embedding = keras.layers.Embedding(
            input_dim or self.vocab_size, self.embed_dim, name="token_embedding",
            dtype=self.dtype_policy
        )
        self.token_embedding.build(ids_shape)
        self.position_encoding = SinusoidalPositionEncoding(
            dropout=self.dropout, seed=self.seed, name="position_encoding",
            dtype=self.dtype_policy,
        )
        embedded_shape = tuple(ids_shape) + (self.embed_dim,)
        self.position_encoding.build(embedded_shape)
        self.final_norm = None
        if self.norm_first:  # pre-LN leaves the residual stream unnormalized
            self.final_norm = keras.layers.LayerNormalization(
                epsilon=1e-5, name="final_norm", dtype=self.dtype_policy
            )
            self.final_norm.build(embedded_shape)

    def _embed(self, token_ids, start_index=0, training=None):
        """Embedding · √d + P, then dropout: `(B, T)` ids -> `(B, T, d)`."""
        x = self.token_embedding(token_ids)  # (B, T, d)
        x = x * ops.cast(math.sqrt(self.embed_dim), x.dtype)
        return self.position_encoding(x, start_index=start_index, training=training)

    def _finish(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "num_layers": self.num_layers,
                "embed_dim": self.embed_dim,
                "num_heads": self.num_heads,
                "ffn_dim": self.ffn_dim,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "activation": serialize_activation(self.activation),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
                "attention_window": self.attention_window,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoder(_TransformerStack):
    """Transformer encoder: token embedding · √d + sinusoidal positions + dropout, N blocks.

    Token id 0 is padding: it is hidden from every self-attention, and the output carries the
    Keras implicit mask `token_ids != 0`. With `norm_first=True` a final LayerNorm closes the
    stack.

    Args:
        vocab_size: int, number of source tokens.
        num_layers: int, number of `TransformerEncoderBlock`s.
        embed_dim: int, model size `d`.
        num_heads: int, attention heads per block; must divide `embed_dim`.
        ffn_dim: int, hidden size of each block's FFN.
        dropout: float in [0, 1), dropout after the position encoding and in every block.
            Defaults to `0.0`.
        norm_first: bool, pre-LN blocks. Defaults to `False`.
        activation: FFN activation. Defaults to `"relu"`.
        kernel_initializer: initializer of the block kernels. Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.
        attention_window: optional int, sliding-window self-attention in every block
            (see `TransformerEncoderBlock`). Defaults to `None` (full attention).

    Call arguments:
        inputs: integer token ids `(B, S)`, 0 = padding.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, embed_dim)`, with the implicit mask `inputs != 0`.

    Example:
    >>> encoder = TransformerEncoder(100, num_layers=2, embed_dim=32, num_heads=4, ffn_dim=64)
    >>> encoder(keras.ops.array([[5, 6, 7, 0]])).shape  # (1, 4, 32)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    def build(self, inputs_shape):
        self._check_ids_shape("inputs", inputs_shape)
        self._build_embedding(inputs_shape)
        embedded_shape = tuple(inputs_shape) + (self.embed_dim,)
        self.blocks = []
        for i in range(self.num_layers):
            block = TransformerEncoderBlock(**self._block_kwargs(), name=f"block_{i}")
            block.build(embedded_shape)
            self.blocks.append(block)

    def call(self, inputs, training=None):
        padding_mask = ops.not_equal(inputs, PAD_ID)  # (B, S)
        x = self._embed(inputs, training=training)  # (B, S, d)
        for block in self.blocks:
            x = block(x, padding_mask=padding_mask, training=training)
        return self._finish(x)

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, PAD_ID)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape) + (self.embed_dim,)


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoder(_TransformerStack):
    """Transformer decoder: embedding · √d + positions + dropout, N blocks, vocabulary logits.

    Target id 0 is padding (hidden by the causal self-attention's key mask, and padded queries
    get a zero context); source padding is hidden from the cross-attention. The logits are
    float32 under mixed precision.

    It implements the decoding contract of `keras_attn.decoding`: `init_decode_state` builds
    a static-shape state (self-attention caches preallocated to `max_length`, the projected
    encoder keys and values, the source mask) and `decode_step` runs one token through the
    stack, writing its keys and values into the caches in place.

    Args:
        vocab_size: int, number of target tokens (size of the logits).
        num_layers: int, number of `TransformerDecoderBlock`s.
        embed_dim: int, model size `d`.
        num_heads: int, attention heads per block; must divide `embed_dim`.
        ffn_dim: int, hidden size of each block's FFN.
        dropout: float in [0, 1), dropout after the position encoding and in every block.
            Defaults to `0.0`.
        norm_first: bool, pre-LN blocks (and a final LayerNorm). Defaults to `False`.
        activation: FFN activation. Defaults to `"relu"`.
        kernel_initializer: initializer of the block kernels. Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.
        attention_window: optional int, sliding-window self-attention in every block
            (see `TransformerEncoderBlock`). Defaults to `None` (full attention).

    Call arguments:
        inputs: integer target ids `(B, T)`, starting with `<bos>`; 0 = padding.
        encoder_outputs: `(B, S, encoder_dim)`.
        encoder_padding_mask: optional boolean `(B, S)`, True at real source tokens. Defaults
            to the implicit mask of `encoder_outputs` (which `TransformerEncoder` sets).
        return_attention_scores: bool, also return the cross-attention weights of every layer.
            Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        float32 logits `(B, T, vocab_size)`; with `return_attention_scores=True` also the
        weights `(B, num_layers, num_heads, T, S)`.

    Example:
    >>> decoder = TransformerDecoder(100, num_layers=2, embed_dim=32, num_heads=4, ffn_dim=64)
    >>> logits = decoder(keras.ops.array([[2, 9, 4]]), keras.ops.ones((1, 5, 32)))  # (1, 3, 100)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self._check_ids_shape("inputs", inputs_shape)
        embedded_shape = tuple(inputs_shape) + (self.embed_dim,)
        encoder_outputs_shape = encoder_outputs_shape or embedded_shape
        self._build_embedding(inputs_shape)
        self.blocks = []
        for i in range(self.num_layers):
            block = TransformerDecoderBlock(**self._block_kwargs(), name=f"block_{i}")
            block.build(embedded_shape, encoder_outputs_shape)
            self.blocks.append(block)
        # The vocabulary projection, the largest product of the model, runs in the compute
        # dtype; its logits are cast to float32, so the softmax and the loss run in float32 (the
        # Keras mixed-precision guide's advice: a mixed Dense, then a float32 softmax).
        self.output_dense = keras.layers.Dense(
            self.vocab_size,
            kernel_initializer=self.kernel_initializer,
            name="output_dense",
            dtype=self.dtype_policy,
        )
        self.output_dense.build(embedded_shape)

    def call(
        self,
        inputs,
        encoder_outputs,
        encoder_padding_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        if encoder_padding_mask is None:
            encoder_padding_mask = getattr(encoder_outputs, "_keras_mask", None)
        decoder_padding_mask = ops.not_equal(inputs, PAD_ID)  # (B, T)
        x = self._embed(inputs, training=training)  # (B, T, d)
        weights = []
        for block in self.blocks:
            x, w = block(
                x,
                encoder_outputs,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                return_attention_scores=True,
                training=training,
            )  # (B, T, d), (B, H, T, S)
            weights.append(w)
        logits = ops.cast(self.output_dense(self._finish(x)), "float32")  # (B, T, V)
        if return_attention_scores:
            return logits, ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, T, S)
        return logits

    # ---- the decoding contract of keras_attn.decoding ----------------------------------------

    def init_decode_state(self, encoder_outputs, source_ids, max_length: int) -> dict:
        """The decoding state for `decode_step`; every tensor has the batch on axis 0.

        Args:
            encoder_outputs: `(B, S, encoder_dim)`.
            source_ids: `(B, S)` source token ids (0 = padding).
            max_length: int, the number of target positions the caches hold.

        Returns:
            A dict: `"self_attention_cache"`, one `(k, v)` per layer, each
            `(B, num_heads, max_length, head_dim)`, all zeros; `"cross_attention_cache"`, one
            `(k, v)` per layer, each `(B, num_heads, S, head_dim)`; `"encoder_padding_mask"`,
            boolean `(B, S)`.
        """
        check_positive_int("max_length", max_length)
        batch_size = ops.shape(source_ids)[0]
        padding_mask = ops.not_equal(source_ids, PAD_ID)  # (B, S)
        return {
            "self_attention_cache": tuple(
                block.init_self_attention_cache(batch_size, max_length) for block in self.blocks
            ),
            "cross_attention_cache": tuple(
                block.compute_cross_attention_cache(encoder_outputs, padding_mask)
                for block in self.blocks
            ),
            "encoder_padding_mask": padding_mask,
        }

    def decode_step(self, token_ids, index, state: dict):
        """Run one target token through the stack using and updating the cache.

        Args:
            token_ids: int `(B,)`, the token at target position `index`.
            index: scalar int tensor (or int), its position (0 for `<bos>`).
            state: the dict from `init_decode_state` or the previous `decode_step`.

        Returns:
            `(logits, state, attention)`: float32 logits `(B, vocab_size)` for position
            `index + 1`, the updated state, and float32 cross-attention weights
            `(B, num_layers, num_heads, S)`.
        """
        token_ids = ops.expand_dims(ops.cast(token_ids, "int32"), -1)  # (B, 1)
        x = self._embed(token_ids, start_index=index)  # (B, 1, d)
        self_caches, weights = [], []
        for block, self_cache, cross_cache in zip(
            self.blocks, state["self_attention_cache"], state["cross_attention_cache"]
        ):
            x, self_cache, w = block(
                x,
                encoder_padding_mask=state["encoder_padding_mask"],
                self_attention_cache=self_cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
                return_attention_scores=True,
            )  # (B, 1, d), 2 x (B, H, max_length, d_h), (B, H, 1, S)
            self_caches.append(self_cache)
            weights.append(w[:, :, 0, :])  # (B, H, S)
        logits = ops.cast(self.output_dense(self._finish(x))[:, 0, :], "float32")  # (B, V)
        attention = ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, S)
        state = dict(state, self_attention_cache=tuple(self_caches))
        return logits, state, attention

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape) + (self.vocab_size,)

    def compute_output_spec(self, inputs, encoder_outputs, encoder_padding_mask=None,
                            return_attention_scores=False, training=None):
        # The logits are float32 whatever the dtype policy.
        logits = keras.KerasTensor(tuple(inputs.shape) + (self.vocab_size,), dtype="float32")
        if not return_attention_scores:
            return logits
        weights_shape = (inputs.shape[0], self.num_layers, self.num_heads, inputs.shape[1],
                         encoder_outputs.shape[1])
        return logits, keras.KerasTensor(weights_shape, dtype="float32")
