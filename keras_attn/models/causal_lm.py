"""A decoder-only language model: GPT-, LLaMA- or T5-decoder-style, as one functional model."""

from __future__ import annotations

import keras

from keras_attn.models.decoder_only import TransformerDecoderOnly


def causal_lm(
    vocab_size: int,
    num_layers: int = 2,
    embed_dim: int = 128,
    num_heads: int = 4,
    ffn_dim: int = 512,
    dropout: float = 0.0,
    position_encoding="rope",
    max_length: int | None = None,
    num_key_value_heads: int | None = None,
    norm: str = "rms",
    activation="swiglu",
    tie_embeddings: bool = False,
    implementation: str = "dense",
    chunk_size: int | None = None,
    sliding_window: int | None = None,
    name: str = "causal_lm",
    **kwargs,
) -> keras.Model:
    """A decoder-only Transformer language model as a functional `keras.Model`.

    `logits = decoder(token_ids)`: the logits at position `t` predict token `t + 1`. Token id 0
    is padding (`pad_id`). The model has one layer, named `"decoder"` (a
    `TransformerDecoderOnly`), so `keras_attn.decoding.generate` decodes it with its static
    cache. The defaults make a small LLaMA-style model (RoPE, RMSNorm, SwiGLU, pre-norm); GPT-2
    style is `position_encoding="learned", norm="layer", activation="gelu_tanh",
    tie_embeddings=True`. `implementation="chunked"` trains long sequences in memory linear in
    their length (exact attention; `dropout=0`).

    Args:
        vocab_size: int, number of tokens.
        num_layers: int. Defaults to `2`.
        embed_dim: int, model size. Defaults to `128`.
        num_heads: int, attention heads; must divide `embed_dim`. Defaults to `4`.
        ffn_dim: int, hidden size of the FFNs. Defaults to `512`.
        dropout: float in [0, 1). Defaults to `0.0`.
        position_encoding: `"rope"`, `"alibi"`, `"relative"`, `"sinusoidal"`, `"learned"`, or
            a position layer (e.g. `RotaryEmbedding(max_wavelength=500000)`).
            Defaults to `"rope"`.
        max_length: optional int, the longest sequence (required by `"learned"`).
            Defaults to `None`.
        num_key_value_heads: optional int, grouped-query attention (1 = multi-query).
            Defaults to `None`.
        norm: `"rms"` or `"layer"`. Defaults to `"rms"`.
        activation: FFN activation (`"swiglu"`, `"geglu"`, `"gelu_tanh"`, or any Keras
            activation). Defaults to `"swiglu"`.
        tie_embeddings: bool, the vocabulary projection is the transposed token embedding.
            Defaults to `False`.
        implementation: the attention kernel, `"dense"`, `"chunked"` or `"local"` (with
            `sliding_window`). Defaults to `"dense"`.
        chunk_size: optional int, keys per block of the chunked kernel. Defaults to `None`.
        sliding_window: optional int, each token sees the `sliding_window` latest tokens
            (itself included; Mistral's meaning). Defaults to `None`.
        name: str, the model's name. Defaults to `"causal_lm"`.
        **kwargs: further `TransformerDecoderOnly` arguments (`norm_first`, `epsilon`,
            `head_dim`, `use_bias`, `pad_id`, `kernel_initializer`, `seed`, ...).

    Returns:
        `keras.Model(token_ids (B, T) int32 -> logits (B, T, vocab_size) float32)`.

    Example:
    >>> model = causal_lm(1000, num_layers=2, embed_dim=64, num_heads=4, ffn_dim=128,
    ...                   num_key_value_heads=2)
    >>> model.compile("adam", keras_attn.metrics.MaskedSequenceLoss())
    >>> tokens = keras_attn.decoding.generate(model, prompt_ids, max_length=64)
    """
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    decoder = TransformerDecoderOnly(
        vocab_size, num_layers, embed_dim, num_heads, ffn_dim, dropout=dropout,
        position_encoding=position_encoding, max_length=max_length,
        num_key_value_heads=num_key_value_heads, norm=norm, activation=activation,
        tie_embeddings=tie_embeddings, implementation=implementation, chunk_size=chunk_size,
        sliding_window=sliding_window, name="decoder", **kwargs,
    )
    return keras.Model(token_ids, decoder(token_ids), name=name)
