"""The Transformer sequence-to-sequence model of "Attention Is All You Need"."""

from __future__ import annotations

import keras

from keras_attn.layers.transformer import TransformerDecoder, TransformerEncoder
from keras_attn.tokens import PAD_ID


def transformer_seq2seq(
    source_vocab_size: int,
    target_vocab_size: int,
    num_layers: int = 2,
    embed_dim: int = 128,
    num_heads: int = 4,
    ffn_dim: int = 512,
    dropout: float = 0.1,
    norm_first: bool = False,
    attention_window: int | None = None,
    name: str = "transformer_seq2seq",
) -> keras.Model:
    """A Transformer encoder-decoder as a functional `keras.Model`.

    `logits = decoder(target_in_ids, encoder(source_ids))`, teacher-forced: `target_in_ids` is
    the target shifted right (`<bos>` first), and the logits predict the next token at every
    position. Token id 0 is padding on both sides. The model contains the layers `"encoder"`
    (`TransformerEncoder`) and `"decoder"` (`TransformerDecoder`), so
    `keras_attn.decoding.greedy_search` / `beam_search` decode with its static cache.

    Args:
        source_vocab_size: int, number of source tokens.
        target_vocab_size: int, number of target tokens (size of the logits).
        num_layers: int, blocks in the encoder and in the decoder. Defaults to `2`.
        embed_dim: int, model size `d`. Defaults to `128`.
        num_heads: int, attention heads; must divide `embed_dim`. Defaults to `4`.
        ffn_dim: int, hidden size of the feed-forward networks. Defaults to `512`.
        dropout: float in [0, 1), dropout everywhere the paper puts it. Defaults to `0.1`.
        norm_first: bool, pre-LN blocks instead of post-LN. Defaults to `False`.
        attention_window: optional int, sliding-window self-attention (each token sees the
            tokens within this distance; causal in the decoder) instead of full
            self-attention. Defaults to `None`.
        name: str, the model name. Defaults to `"transformer_seq2seq"`.

    Returns:
        An uncompiled `keras.Model` with inputs `source_ids` `(B, S)` and `target_in_ids`
        `(B, T)` (int32) and output float32 logits `(B, T, target_vocab_size)`.

    Example:
    >>> model = transformer_seq2seq(100, 120, num_layers=1, embed_dim=32, num_heads=4,
    ...                             ffn_dim=64)
    >>> model.compile("adam", loss=keras_attn.metrics.masked_sparse_categorical_crossentropy)
    >>> logits = model([keras.ops.array([[5, 6, 0]]), keras.ops.array([[2, 7]])])  # (1, 2, 120)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """
    stack_kwargs = {
        "num_layers": num_layers,
        "embed_dim": embed_dim,
        "num_heads": num_heads,
        "ffn_dim": ffn_dim,
        "dropout": dropout,
        "norm_first": norm_first,
        "attention_window": attention_window,
    }
    encoder = TransformerEncoder(source_vocab_size, **stack_kwargs, name="encoder")
    decoder = TransformerDecoder(target_vocab_size, **stack_kwargs, name="decoder")
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_in_ids = keras.Input(shape=(None,), dtype="int32", name="target_in_ids")
    encoder_outputs = encoder(source_ids)  # (B, S, d)
    source_mask = keras.ops.not_equal(source_ids, PAD_ID)  # (B, S)
    logits = decoder(target_in_ids, encoder_outputs, encoder_padding_mask=source_mask)
    return keras.Model([source_ids, target_in_ids], logits, name=name)
