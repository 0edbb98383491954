"""Transformer encoder and decoder blocks.

A block composes the core layers the way the paper draws it: `MultiHead` → `AddNorm` → `FFN` →
`AddNorm` (post-LN), or with `normalize_first=True` the pre-LN form `x + Sublayer(LayerNorm(x))`.
The decoder block takes a static-shape key/value cache for decoding one token at a time.
"""

from __future__ import annotations

import keras

from keras_attn._checks import check_bool
from keras_attn.layers import legacy
from keras_attn.layers.block_base import (  # noqa: F401 - AttentionConfig: the examples
    AttentionConfig,
    _check_embedded_shape,
    _TransformerBlock,
    call_layer,
    document_block,
)


@keras.saving.register_keras_serializable(package="keras_attn")
@document_block(normalize_first=False)
class TransformerEncoderBlock(_TransformerBlock):
    """One Transformer encoder block: self-attention and a position-wise FFN.

    Post-LN (the paper, default): `h = LayerNorm(x + MultiHead(x))`,
    `y = LayerNorm(h + FFN(h))`. Pre-LN (`normalize_first=True`):
    `h = x + MultiHead(LayerNorm(x))`, `y = h + FFN(LayerNorm(h))`. Each head has size
    `hidden_dim // num_heads` unless the configuration gives `head_dim`; `num_heads` must then
    divide the input size (checked at build).

    Args:
{args}

    Call arguments:
        inputs: `(B, S, hidden_dim)`.
        padding_mask: optional boolean `(B, S)`, True at real tokens. Defaults to the Keras
            implicit mask of `inputs`, if any. Padded positions are hidden as keys, and as
            queries they get a zero attention context.
        attention_mask: optional boolean `(B, S, S)`, True = attend.
        return_attention_scores: bool, also return the self-attention weights (the dense
            kernel forms them; otherwise they are never computed). Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, hidden_dim)`; with `return_attention_scores=True` also the weights
        `(B, num_heads, S, S)`. The implicit mask of `inputs` passes through.

    Example:
    >>> block = TransformerEncoderBlock(AttentionConfig(num_heads=2), intermediate_dim=32)
    >>> block(keras.ops.ones((2, 5, 16))).shape  # (2, 5, 16)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
        Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture",
        https://arxiv.org/abs/2002.04745
    """

    def build(self, inputs_shape):
        _check_embedded_shape("inputs", inputs_shape)
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(hidden_dim, "self_attention", causal=False)
        self._build_attention(self.self_attention, inputs_shape)
        self.self_attention_norm = self._norm("self_attention", inputs_shape)
        self.ffn = self._ffn(hidden_dim, inputs_shape)
        self.ffn_norm = self._norm("ffn", inputs_shape)
        self._build_residual_dropout()

    def call(self, inputs, padding_mask=None, attention_mask=None,
             return_attention_scores=False, training=None):
        if padding_mask is None:
            padding_mask = getattr(inputs, "_keras_mask", None)
        x = inputs  # (B, S, d)
        h = self._before(self.self_attention_norm, x)
        h = self.self_attention(
            h, query_mask=padding_mask, attention_mask=attention_mask, training=training,
            return_attention_scores=return_attention_scores,
        )  # (B, S, d) [, (B, H, S, S)]
        h, weights = h if return_attention_scores else (h, None)
        x = self._after(self.self_attention_norm, x, h, training)
        outputs = self._ffn_sublayer(x, training)
        return (outputs, weights) if return_attention_scores else outputs

    def compute_output_spec(self, inputs, padding_mask=None, attention_mask=None,
                            return_attention_scores=False, training=None):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if return_attention_scores:
            return outputs, self._weights_spec(inputs, inputs.shape[1])
        return outputs


@keras.saving.register_keras_serializable(package="keras_attn")
@document_block(normalize_first=False)
class TransformerDecoderBlock(_TransformerBlock):
    """One Transformer decoder block: causal self-attention, cross-attention, FFN.

    Post-LN (default): `h = LayerNorm(x + MultiHead(x, causal))`,
    `c = LayerNorm(h + MultiHead(h, encoder_outputs))`, `y = LayerNorm(c + FFN(c))`; pre-LN
    (`normalize_first=True`) normalizes each sublayer's input instead and adds the raw
    residual.
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
{args}
        causal: bool, causal self-attention (each position sees itself and earlier ones).
            Defaults to `True`.

        The configuration's `sliding_window` and `position_encoding` apply to the
        self-attention only; the cross-attention takes the kernel (`"local"` becomes `"dense"`
        there), the heads, `num_key_value_heads`, biases and soft-cap.

    Call arguments:
        inputs: `(B, T, hidden_dim)`, the embedded target.
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
        return_attention_scores: bool, also return the cross-attention weights (computed only
            then). Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, hidden_dim)`; then the updated `self_attention_cache` when one was given; then
        the cross-attention weights `(B, num_heads, T, S)` when `return_attention_scores=True`.

    Example:
    >>> block = TransformerDecoderBlock(2, intermediate_dim=32)  # 2 heads
    >>> block(keras.ops.ones((2, 4, 16)), keras.ops.ones((2, 6, 16))).shape  # (2, 4, 16)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    @legacy.records_given
    def __init__(self, attention=None, intermediate_dim: int | None = None,
                 dropout: float = 0.0, normalize_first: bool | None = None, activation="relu",
                 layer_norm_epsilon: float = 1e-5, norm: str = "layer", use_bias: bool = True,
                 kernel_initializer="glorot_uniform", seed: int | None = None,
                 causal: bool = True, **kwargs):
        super().__init__(attention, intermediate_dim, dropout, normalize_first, activation,
                         layer_norm_epsilon, norm, use_bias, kernel_initializer, seed, **kwargs)
        check_bool("causal", causal)
        self.causal = causal

    def build(self, inputs_shape, encoder_outputs_shape=None):
        _check_embedded_shape("inputs", inputs_shape)
        encoder_outputs_shape = encoder_outputs_shape or inputs_shape
        _check_embedded_shape("encoder_outputs", encoder_outputs_shape)
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(hidden_dim, "self_attention", causal=self.causal)
        self._build_attention(self.self_attention, inputs_shape)
        self.self_attention_norm = self._norm("self_attention", inputs_shape)
        self.cross_attention = self._attention(hidden_dim, "cross_attention")
        self._build_attention(self.cross_attention, inputs_shape, encoder_outputs_shape)
        self.cross_attention_norm = self._norm("cross_attention", inputs_shape)
        self.ffn = self._ffn(hidden_dim, inputs_shape)
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
            h, self_attention_cache = call_layer(
                self.self_attention, h,
                query_mask=decoder_padding_mask,
                use_causal_mask=True,
                training=training,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
            )  # (B, T, d), 2 x (B, H, max_length, d_h)
        x = self._after(self.self_attention_norm, x, h, training)

        # Cross-attention to the encoder, source padding hidden; weights only when asked.
        h = self._before(self.cross_attention_norm, x)
        h = call_layer(
            self.cross_attention, h,
            encoder_outputs if cross_attention_cache is None else None,
            query_mask=decoder_padding_mask,
            key_mask=encoder_padding_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cross_attention_cache,
        )  # (B, T, d) [, cache] [, (B, H, T, S)]
        h = h if isinstance(h, tuple) else (h,)
        weights = h[-1] if return_attention_scores else None
        x = self._after(self.cross_attention_norm, x, h[0], training)

        outputs = self._ffn_sublayer(x, training)  # (B, T, d)
        results = (outputs,)
        if self_attention_cache is not None:
            results += (self_attention_cache,)
        if return_attention_scores:
            results += (weights,)
        return results[0] if len(results) == 1 else results

    def compute_output_spec(self, inputs, encoder_outputs=None, decoder_padding_mask=None,
                            encoder_padding_mask=None, self_attention_cache=None,
                            self_attention_cache_update_index=None, cross_attention_cache=None,
                            return_attention_scores=False, training=None):
        results = (keras.KerasTensor(inputs.shape, dtype=self.compute_dtype),)
        if self_attention_cache is not None:
            results += (tuple(keras.KerasTensor(c.shape, dtype=c.dtype)
                              for c in self_attention_cache),)
        if return_attention_scores:
            source = (encoder_outputs.shape[1] if encoder_outputs is not None
                      else cross_attention_cache[0].shape[2])
            results += (self._weights_spec(inputs, source),)
        return results[0] if len(results) == 1 else results

    def get_config(self):
        config = super().get_config()
        config["causal"] = self.causal
        return config
