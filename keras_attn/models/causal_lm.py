"""A decoder-only language model: GPT-, LLaMA- or T5-decoder-style, as one functional model."""

from __future__ import annotations

import keras

from keras_attn.layers import legacy
from keras_attn.layers.config import AttentionConfig
from keras_attn.models.assembly import builder_block
from keras_attn.models.decoder_only import TransformerDecoderOnly

# The attention positions (a name or a position layer); "sinusoidal" and "learned" are added
# to the token embeddings instead.
_EMBEDDED = ("sinusoidal", "learned")


@legacy.records_given
def causal_lm(
    vocabulary_size: int | None = None,
    num_layers: int = 2,
    hidden_dim: int = 128,
    num_heads: int = 4,
    intermediate_dim: int = 512,
    dropout: float = 0.0,
    position_encoding="rope",
    max_sequence_length: int | None = None,
    tie_word_embeddings: bool = False,
    attention: AttentionConfig | None = None,
    name: str = "causal_lm",
    **kwargs,
) -> keras.Model:
    """A decoder-only Transformer language model as a functional `keras.Model`.

    `logits = decoder(token_ids)`: the logits at position `t` predict token `t + 1`. Token id 0
    is padding (`pad_id`). The model has one layer, named `"decoder"` (a
    `TransformerDecoderOnly`), so `keras_attn.decoding.generate` decodes it with its static
    cache. The defaults make a small LLaMA-style model (RoPE, RMSNorm, SwiGLU, pre-norm); GPT-2
    style is `position_encoding="learned", norm="layer", activation="gelu_tanh",
    tie_word_embeddings=True`. `implementation="chunked"` trains long sequences in memory
    linear in their length (exact attention; `dropout=0`).

    Args:
        vocabulary_size: int, number of tokens.
        num_layers: int. Defaults to `2`.
        hidden_dim: int, model size. Defaults to `128`.
        num_heads: int, attention heads; must divide `hidden_dim` unless `head_dim` is given.
            Defaults to `4` (or `attention.num_heads`).
        intermediate_dim: int, hidden size of the FFNs. Defaults to `512`.
        dropout: float in [0, 1). Defaults to `0.0`.
        position_encoding: `"rope"`, `"alibi"`, `"relative"` or a position layer (e.g.
            `RotaryEmbedding(max_wavelength=500000)`) inside the attention, or `"sinusoidal"`,
            `"learned"` added to the embeddings, or None. Defaults to `"rope"`.
        max_sequence_length: optional int, the longest sequence (required by `"learned"`).
            Defaults to `None`.
        tie_word_embeddings: bool, the vocabulary projection is the transposed token
            embedding. Defaults to `False`.
        attention: optional `AttentionConfig`; its fields may also be given here as keywords
            (`num_key_value_heads`, `head_dim`, `implementation`, `chunk_size`,
            `sliding_window`, `soft_cap`, ...). Defaults to `None`.
        name: str, the model's name. Defaults to `"causal_lm"`.
        **kwargs: the attention fields above; the block's `activation` (default
            `"swiglu"`), `norm` (`"rms"`), `normalize_first` (True), `layer_norm_epsilon`,
            `use_bias` (a bool, or the attention projections with a bias: Qwen2's
            `("query", "key", "value")`); the stack's `pad_id`, `kernel_initializer`, `seed`.

    Returns:
        `keras.Model(token_ids (B, T) int32 -> logits (B, T, vocabulary_size) float32)`.

    Example:
    >>> model = causal_lm(1000, num_layers=2, hidden_dim=64, num_heads=4, intermediate_dim=128,
    ...                   num_key_value_heads=2)
    >>> model.compile("adam", keras_attn.metrics.MaskedSequenceLoss())
    >>> tokens = keras_attn.decoding.generate(model, prompt_ids, max_length=64)
    """
    said = legacy.said(causal_lm, vocabulary_size=vocabulary_size, hidden_dim=hidden_dim,
                       intermediate_dim=intermediate_dim, max_sequence_length=max_sequence_length,
                       tie_word_embeddings=tie_word_embeddings)
    max_sequence_length = legacy.rename(  # keras_attn 0.2's name of the position table
        kwargs, "causal_lm", {"max_length": "max_sequence_length"}, said=said).get(
        "max_sequence_length", max_sequence_length)
    embedded = position_encoding if isinstance(position_encoding, str) and (
        position_encoding in _EMBEDDED) else None
    block = builder_block(
        "causal_lm", kwargs, attention,
        {"num_heads": (num_heads, 4),
         "position_encoding": (None if embedded else position_encoding, "rope")},
        given=said, intermediate_dim=intermediate_dim, dropout=dropout, activation="swiglu",
        norm="rms", normalize_first=True)
    vocabulary_size = kwargs.pop("vocabulary_size", vocabulary_size)
    hidden_dim = kwargs.pop("hidden_dim", hidden_dim)
    tie_word_embeddings = kwargs.pop("tie_word_embeddings", tie_word_embeddings)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    decoder = TransformerDecoderOnly(
        vocabulary_size, num_layers, hidden_dim, block, position_embedding=embedded,
        max_sequence_length=max_sequence_length, tie_word_embeddings=tie_word_embeddings,
        name="decoder", **kwargs,
    )
    return keras.Model(token_ids, decoder(token_ids), name=name)
