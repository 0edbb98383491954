"""The block of decoder-only Transformers (GPT, LLaMA, Mistral, T5's decoder without its
encoder): causal self-attention and a feed-forward network, with a static-shape cache for
decoding one token at a time. The stack is `keras_attn.models.TransformerDecoderOnly`."""

from __future__ import annotations

import keras

from keras_attn.layers.block_base import (  # noqa: F401 - AttentionConfig: the examples
    AttentionConfig,
    _check_embedded_shape,
    _TransformerBlock,
    call_layer,
    document_block,
)


@keras.saving.register_keras_serializable(package="keras_attn")
@document_block(normalize_first=True)
class TransformerDecoderOnlyBlock(_TransformerBlock):
    """One decoder-only block: causal self-attention and a feed-forward network, no
    cross-attention.

    Pre-norm (`normalize_first=True`, the default here, as in GPT-2 and LLaMA):
    `h = x + MultiHead(Norm(x), causal)`, `y = h + FFN(Norm(h))`; post-norm otherwise. With
    `norm="rms"`, `activation="swiglu"`, `use_bias=False` and
    `AttentionConfig(num_heads, num_key_value_heads=..., position_encoding="rope",
    use_bias=False)` it is a LLaMA block; add `sliding_window` to the configuration for
    Mistral.

    Args:
{args}

    Call arguments:
        inputs: `(B, T, hidden_dim)`.
        padding_mask: optional boolean `(B, T)`, True at real tokens (default: the implicit
            mask of `inputs`). Padded queries get a zero attention context.
        cache: optional `(key_cache, value_cache)`, each `(B, H_kv, max_length, head_dim)`
            (`init_cache`), with `cache_update_index`, the position of `inputs[:, 0]`.
        return_attention_scores: bool, also return the weights `(B, H, T, S)` (formed only
            then, by the dense kernel). Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, hidden_dim)`; then the updated cache when one was given; then the weights.

    Example:
    >>> block = TransformerDecoderOnlyBlock(
    ...     AttentionConfig(num_heads=4, position_encoding="rope"), intermediate_dim=64)
    >>> block(keras.ops.ones((2, 5, 32))).shape  # (2, 5, 32)
    """

    normalize_first_default = True

    def build(self, inputs_shape):
        _check_embedded_shape("inputs", inputs_shape)
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._attention(hidden_dim, "self_attention", causal=True)
        self._build_attention(self.self_attention, inputs_shape)
        self.self_attention_norm = self._norm("self_attention", inputs_shape)
        self.ffn = self._ffn(hidden_dim, inputs_shape)
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
        results = call_layer(
            self.self_attention, h, query_mask=padding_mask, use_causal_mask=True,
            training=training, cache=cache, cache_update_index=cache_update_index,
            return_attention_scores=return_attention_scores,
        )  # (B, T, d) [, cache] [, (B, H, T, S)]
        results = results if isinstance(results, tuple) else (results,)
        x = self._after(self.self_attention_norm, x, results[0], training)
        outputs = self._ffn_sublayer(x, training)  # (B, T, d)
        return outputs if len(results) == 1 else (outputs,) + results[1:]

    def compute_output_spec(self, inputs, padding_mask=None, cache=None,
                            cache_update_index=None, return_attention_scores=False,
                            training=None):
        results = (keras.KerasTensor(inputs.shape, dtype=self.compute_dtype),)
        if cache is not None:
            results += (tuple(keras.KerasTensor(c.shape, dtype=c.dtype) for c in cache),)
        if return_attention_scores:
            key_len = inputs.shape[1] if cache is None else cache[0].shape[2]
            results += (self._weights_spec(inputs, key_len),)
        return results[0] if len(results) == 1 else results
