"""Transformer encoder and decoder blocks.

A block composes the core layers the way the paper draws it: `MultiHead` → `AddNorm` → `FFN` →
`AddNorm` (post-LN), or with `norm_first=True` the pre-LN form `x + Sublayer(LayerNorm(x))`.
The decoder block takes a static-shape key/value cache for decoding one token at a time.
"""

from __future__ import annotations

import keras

from keras_attn._checks import check_bool, check_number, check_one_of
from keras_attn.layers.add_norm import NORMS, AddNorm, make_norm
from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.ffn import FFN, GATED
from keras_attn.layers.local_attention import LocalMultiHead
from keras_attn.layers.multi_head import MultiHead
from keras_attn.layers.position_bias import RelativePositionBias


def _get_activation(activation):
    """A Keras activation, or the name of a gated one (`"swiglu"`, `"geglu"`) as it is."""
    if isinstance(activation, str) and activation in GATED:
        return activation
    try:
        return keras.activations.get(activation)
    except ValueError as error:
        raise ValueError(
            "Received an invalid value for argument `activation`. "
            f"Received: activation={activation!r}"
        ) from error


def serialize_activation(activation):
    """The config form of what `_get_activation` returns."""
    return activation if isinstance(activation, str) else keras.activations.serialize(activation)


def _head_dim(embed_dim: int, num_heads: int) -> int:
    """`embed_dim // num_heads`, refusing to floor it silently."""
    if embed_dim % num_heads:
        raise ValueError(
            f"Received an invalid value for argument `num_heads`, expected a divisor of the "
            f"embedding size {embed_dim}. Received: num_heads={num_heads}"
        )
    return embed_dim // num_heads


def _check_embedded_shape(name: str, shape) -> None:
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"Argument `{name}` must have shape (batch_size, seq_len, embed_dim) with a known "
            f"embed_dim. Received: {name}.shape={tuple(shape)}"
        )


class _TransformerBlock(keras.layers.Layer):
    """What encoder and decoder blocks share: arguments, sublayer wiring, config."""

    def __init__(
        self,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation="relu",
        epsilon: float = 1e-5,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        attention_window: int | None = None,
        norm: str = "layer",
        num_key_value_heads: int | None = None,
        position_encoding: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("ffn_dim", ffn_dim)
        check_one_of("norm", norm, NORMS)
        check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "Received an invalid value for argument `num_key_value_heads`, expected a "
                f"divisor of num_heads={num_heads}. Received: "
                f"num_key_value_heads={num_key_value_heads}"
            )
        check_one_of("position_encoding", position_encoding, (None, "rope", "alibi",
                                                              "relative"))
        self.norm = norm
        self.num_key_value_heads = num_key_value_heads
        self.position_encoding = position_encoding
        check_positive_int("attention_window", attention_window, allow_none=True)
        self.attention_window = attention_window
        check_rate("dropout", dropout)
        check_bool("norm_first", norm_first)
        self.num_heads = num_heads
        self.ffn_dim = ffn_dim
        self.dropout = dropout
        self.norm_first = norm_first
        check_number("epsilon", epsilon, 0, strict=True)
        self.activation = _get_activation(activation)
        self.epsilon = epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.supports_masking = True

    def _attention(self, embed_dim: int, name: str, window: int | None = None,
                   causal: bool | None = None) -> MultiHead:
        """Full multi-head attention, or sliding-window attention over `window` neighbours;
        self-attention (`causal` True or False) gets the block's position encoding."""
        kwargs = {
            "num_heads": self.num_heads,
            "key_dim": _head_dim(embed_dim, self.num_heads),
            "output_dim": embed_dim,
            "dropout": self.dropout,
            "kernel_initializer": self.kernel_initializer,
            "seed": self.seed,
            "num_key_value_heads": self.num_key_value_heads,
            "name": name,
            "dtype": self.dtype_policy,
        }
        if causal is not None and self.position_encoding is not None:
            kwargs["position_encoding"] = self.position_encoding
            if self.position_encoding == "relative":  # a causal query sees no later key
                kwargs["position_encoding"] = RelativePositionBias(
                    bidirectional=not causal, name="position_encoding", dtype=self.dtype_policy)
        if window is not None:
            return LocalMultiHead(window=window, **kwargs)
        return MultiHead(**kwargs)

    def _ffn(self, embed_dim: int, input_shape) -> FFN:
        ffn = FFN(
            hidden_dim=self.ffn_dim,
            output_dim=embed_dim,
            activation=self.activation,
            dropout=self.dropout,
            kernel_initializer=self.kernel_initializer,
            seed=self.seed,
            name="ffn",
            dtype=self.dtype_policy,
        )
        ffn.build(input_shape)
        return ffn

    def _norm(self, name: str, input_shape):
        """Post-LN: an `AddNorm` applied after the sublayer. Pre-LN: a `LayerNormalization`
        applied before it (the residual add then uses `residual_dropout`)."""
        if self.norm_first:
            norm = make_norm(self.norm, self.epsilon, f"{name}_norm", self.dtype_policy)
            norm.build(input_shape)
        else:
            norm = AddNorm(
                dropout=self.dropout,
                epsilon=self.epsilon,
                seed=self.seed,
                norm=self.norm,
                name=f"{name}_add_norm",
                dtype=self.dtype_policy,
            )
            norm.build(input_shape, input_shape)
        return norm

    def _build_residual_dropout(self) -> None:
        self.residual_dropout = None
        if self.norm_first:
            self.residual_dropout = Dropout(
                self.dropout, seed=self.seed, name="residual_dropout", dtype=self.dtype_policy
            )

    def _before(self, norm, x):
        """The sublayer input: LayerNorm(x) in pre-LN, x in post-LN."""
        return norm(x) if self.norm_first else x

    def _after(self, norm, x, y, training):
        """The residual: x + Dropout(y) in pre-LN, LayerNorm(x + Dropout(y)) in post-LN."""
        if self.norm_first:
            return x + self.residual_dropout(y, training=training)
        return norm(x, y, training=training)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "ffn_dim": self.ffn_dim,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "activation": serialize_activation(self.activation),
                "epsilon": self.epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
                "attention_window": self.attention_window,
                "norm": self.norm,
                "num_key_value_heads": self.num_key_value_heads,
                "position_encoding": self.position_encoding,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerEncoderBlock(_TransformerBlock):
    """One Transformer encoder block: self-attention and a position-wise FFN.

    Post-LN (the paper, default): `h = LayerNorm(x + MultiHead(x))`,
    `y = LayerNorm(h + FFN(h))`. Pre-LN (`norm_first=True`): `h = x + MultiHead(LayerNorm(x))`,
    `y = h + FFN(LayerNorm(h))`. Each head has size `embed_dim // num_heads`; `num_heads` must
    divide the input size (checked at build).

    Args:
        num_heads: int, number of attention heads.
        ffn_dim: int, hidden size of the feed-forward network.
        dropout: float in [0, 1), dropout on the attention weights, the FFN hidden layer and
            each residual branch. Defaults to `0.0`.
        norm_first: bool, pre-LN instead of post-LN. Defaults to `False`.
        activation: activation of the FFN hidden layer, or `"swiglu"` / `"geglu"` (a gated
            FFN). Defaults to `"relu"`.
        epsilon: float, the norms' epsilon. Defaults to `1e-5`.
        kernel_initializer: initializer of every dense kernel. Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.
        norm: `"layer"` or `"rms"` (`keras.layers.RMSNormalization`). Defaults to `"layer"`.
        num_key_value_heads: optional int, grouped-query self-attention (see `MultiHead`).
            Defaults to `None`.
        position_encoding: optional `"rope"`, `"alibi"` or `"relative"` for the
            self-attention (see `MultiHead`; T5 buckets are one-directional when causal).
            Defaults to `None`.
        attention_window: optional int: self-attention sees only keys within this distance
            (sliding-window `LocalMultiHead`, O(S·window) instead of O(S²)). Defaults to
            `None` (full attention).

    Call arguments:
        inputs: `(B, S, embed_dim)`.
        padding_mask: optional boolean `(B, S)`, True at real tokens. Defaults to the Keras
            implicit mask of `inputs`, if any. Padded positions are hidden as keys, and as
            queries they get a zero attention context.
        attention_mask: optional boolean `(B, S, S)`, True = attend.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, embed_dim)`. The implicit mask of `inputs` passes through.

    Example:
    >>> block = TransformerEncoderBlock(num_heads=2, ffn_dim=32)
    >>> block(keras.ops.ones((2, 5, 16))).shape  # (2, 5, 16)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
        Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture",
        https://arxiv.org/abs/2002.04745
    """

    def build(self, inputs_shape):
        _check_embedded_shape("inputs", inputs_shape)
        embed_dim = inputs_shape[-1]
        self.self_attention = self._attention(embed_dim, "self_attention",
                                              self.attention_window, causal=False)
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention", inputs_shape)
        self.ffn = self._ffn(embed_dim, inputs_shape)
        self.ffn_norm = self._norm("ffn", inputs_shape)
        self._build_residual_dropout()

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None):
        if padding_mask is None:
            padding_mask = getattr(inputs, "_keras_mask", None)
        x = inputs  # (B, S, d)
        h = self._before(self.self_attention_norm, x)
        h = self.self_attention(
            h, query_mask=padding_mask, attention_mask=attention_mask, training=training
        )  # (B, S, d)
        x = self._after(self.self_attention_norm, x, h, training)
        h = self.ffn(self._before(self.ffn_norm, x), training=training)  # (B, S, d)
        return self._after(self.ffn_norm, x, h, training)


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoderBlock(_TransformerBlock):
    """One Transformer decoder block: causal self-attention, cross-attention, FFN.

    Post-LN (default): `h = LayerNorm(x + MultiHead(x, causal))`,
    `c = LayerNorm(h + MultiHead(h, encoder_outputs))`, `y = LayerNorm(c + FFN(c))`; pre-LN
    (`norm_first=True`) normalizes each sublayer's input instead and adds the raw residual.
    Source padding is hidden from the cross-attention.

    For decoding one token at a time, pass `self_attention_cache` (from
    `init_self_attention_cache`) with `self_attention_cache_update_index`, the position of this
    call's first token: its keys and values are written into the preallocated cache (a slice
    update, static shape) and the causal mask is offset accordingly. `cross_attention_cache`
    (from `compute_cross_attention_cache`) replaces `encoder_outputs` so the encoder keys and
    values are projected once.

    With `causal=False` the self-attention is bidirectional (every target position sees every
    other non-padding one), the decoder of a conditional masked language model (Mask-Predict);
    such a block has no incremental cache.

    Args:
        As `TransformerEncoderBlock`; `attention_window`, `num_key_value_heads` and
        `position_encoding` apply to the self-attention only (cross-attention stays
        full, without positions).
        causal: bool, causal self-attention (each position sees itself and earlier ones).
            Defaults to `True`.

    Call arguments:
        inputs: `(B, T, embed_dim)`, the embedded target.
        encoder_outputs: `(B, S, encoder_dim)`. May be None when `cross_attention_cache` is
            given.
        decoder_padding_mask: optional boolean `(B, T)`, True at real target tokens. Defaults
            to the implicit mask of `inputs`.
        encoder_padding_mask: optional boolean `(B, S)`, True at real source tokens. Defaults
            to the implicit mask of `encoder_outputs`.
        self_attention_cache: optional `(key_cache, value_cache)`, each
            `(B, num_heads, max_length, head_dim)`.
        self_attention_cache_update_index: int or scalar tensor, position of `inputs[:, 0]`.
        cross_attention_cache: optional `(key_cache, value_cache)`, each
            `(B, num_heads, S, head_dim)`.
        return_attention_scores: bool, also return the cross-attention weights.
            Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, embed_dim)`; then the updated `self_attention_cache` when one was given; then
        the cross-attention weights `(B, num_heads, T, S)` when `return_attention_scores=True`.

    Example:
    >>> block = TransformerDecoderBlock(num_heads=2, ffn_dim=32)
    >>> block(keras.ops.ones((2, 4, 16)), keras.ops.ones((2, 6, 16))).shape  # (2, 4, 16)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    def __init__(self, num_heads: int, ffn_dim: int, causal: bool = True, **kwargs):
        super().__init__(num_heads, ffn_dim, **kwargs)
        check_bool("causal", causal)
        self.causal = causal

    def build(self, inputs_shape, encoder_outputs_shape=None):
        _check_embedded_shape("inputs", inputs_shape)
        encoder_outputs_shape = encoder_outputs_shape or inputs_shape
        _check_embedded_shape("encoder_outputs", encoder_outputs_shape)
        embed_dim = inputs_shape[-1]
        self.self_attention = self._attention(embed_dim, "self_attention",
                                              self.attention_window, causal=self.causal)
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._norm("self_attention", inputs_shape)
        self.cross_attention = self._attention(embed_dim, "cross_attention")
        self.cross_attention.build(inputs_shape, encoder_outputs_shape)
        self.cross_attention_norm = self._norm("cross_attention", inputs_shape)
        self.ffn = self._ffn(embed_dim, inputs_shape)
        self.ffn_norm = self._norm("ffn", inputs_shape)
        self._build_residual_dropout()

    def init_self_attention_cache(self, batch_size, max_length: int):
        """An all-zero self-attention cache `(k, v)`, each `(B, num_heads, max_length, d_h)`."""
        return self.self_attention.init_cache(batch_size, max_length)

    def compute_cross_attention_cache(self, encoder_outputs, encoder_padding_mask=None):
        """The projected encoder keys and values `(k, v)`, each `(B, num_heads, S, d_h)`."""
        return self.cross_attention.compute_cache(encoder_outputs,
                                                  key_mask=encoder_padding_mask)

    def call(
        self,
        inputs,
        encoder_outputs=None,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        if encoder_outputs is None and cross_attention_cache is None:
            raise ValueError(
                "Argument `encoder_outputs` is required unless `cross_attention_cache` is given. "
                "Received: encoder_outputs=None"
            )
        if (self_attention_cache is None) != (self_attention_cache_update_index is None):
            raise ValueError(
                "Arguments `self_attention_cache` and `self_attention_cache_update_index` go "
                "together. Received: self_attention_cache_update_index="
                f"{self_attention_cache_update_index!r}"
            )
        if self_attention_cache is not None and not self.causal:
            raise ValueError(
                "Argument `self_attention_cache` needs a causal block (one token at a time); "
                "this block has causal=False. Received: self_attention_cache="
                f"{type(self_attention_cache).__name__}"
            )
        if decoder_padding_mask is None:
            decoder_padding_mask = getattr(inputs, "_keras_mask", None)
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = getattr(encoder_outputs, "_keras_mask", None)

        # Causal (or bidirectional) self-attention, optionally over the cache.
        x = inputs  # (B, T, d)
        h = self._before(self.self_attention_norm, x)
        if self_attention_cache is None:
            h = self.self_attention(
                h, query_mask=decoder_padding_mask, use_causal_mask=self.causal,
                training=training
            )  # (B, T, d)
        else:
            h, self_attention_cache = self.self_attention(
                h,
                query_mask=decoder_padding_mask,
                use_causal_mask=True,
                training=training,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
            )  # (B, T, d), 2 x (B, H, max_length, d_h)
        x = self._after(self.self_attention_norm, x, h, training)

        # Cross-attention to the encoder, source padding hidden.
        h = self._before(self.cross_attention_norm, x)
        h, *rest = self.cross_attention(
            h,
            encoder_outputs if cross_attention_cache is None else None,
            query_mask=decoder_padding_mask,
            key_mask=encoder_padding_mask,
            return_attention_scores=True,
            training=training,
            cache=cross_attention_cache,
        )  # (B, T, d), [cache,] (B, H, T, S)
        weights = rest[-1]
        x = self._after(self.cross_attention_norm, x, h, training)

        # Position-wise feed-forward network.
        h = self.ffn(self._before(self.ffn_norm, x), training=training)  # (B, T, d)
        outputs = self._after(self.ffn_norm, x, h, training)

        results = (outputs,)
        if self_attention_cache is not None:
            results += (self_attention_cache,)
        if return_attention_scores:
            results += (weights,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config["causal"] = self.causal
        return config
