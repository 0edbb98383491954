"""Bahdanau attention seq2seq as a functional Keras model."""

from __future__ import annotations

import keras

from keras_attn.layers.bahdanau import BahdanauDecoder, BahdanauEncoder
from keras_attn.layers.base import check_positive_int
from keras_attn.tokens import PAD_ID


def bahdanau_seq2seq(
    source_vocab_size: int,
    target_vocab_size: int,
    embed_dim: int = 256,
    units: int = 256,
    num_layers: int = 2,
    dropout: float = 0.2,
    seed: int | None = None,
    name: str = "bahdanau_seq2seq",
) -> keras.Model:
    """GRU encoder-decoder with Bahdanau (additive) attention, trained with teacher forcing.

    The defaults are d2l's (section 11.4). Greedy and beam search: `keras_attn.decoding`.

    Args:
        source_vocab_size: int, size of the source vocabulary (id 0 = padding).
        target_vocab_size: int, size of the target vocabulary (id 0 = padding).
        embed_dim: int, size of the token embeddings. Defaults to `256`.
        units: int, size of the GRU states and of the attention. Defaults to `256`.
        num_layers: int, GRU layers in the encoder and in the decoder. Defaults to `2`.
        dropout: float in [0, 1), dropout between GRU layers. Defaults to `0.2`.
        seed: optional int seed for the dropout. Defaults to `None`.
        name: str, the model's name. Defaults to `"bahdanau_seq2seq"`.

    Returns:
        `keras.Model([source_ids (B, S), target_in_ids (B, T)], logits (B, T,
        target_vocab_size))` (float32 logits) with layers named `"encoder"`
        (`BahdanauEncoder`) and `"decoder"` (`BahdanauDecoder`).

    Example:
    >>> model = bahdanau_seq2seq(100, 120, embed_dim=32, units=32, num_layers=1)
    >>> model.compile("adam", loss=keras_attn.metrics.masked_sparse_categorical_crossentropy)
    >>> model.fit((source_ids, target_in_ids), target_out_ids)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """
    check_positive_int("source_vocab_size", source_vocab_size)
    check_positive_int("target_vocab_size", target_vocab_size)
    sizes = {"embed_dim": embed_dim, "units": units, "num_layers": num_layers,
             "dropout": dropout, "seed": seed}
    encoder = BahdanauEncoder(source_vocab_size, **sizes, name="encoder")
    decoder = BahdanauDecoder(target_vocab_size, **sizes, name="decoder")
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_in_ids = keras.Input(shape=(None,), dtype="int32", name="target_in_ids")
    source_mask = keras.ops.not_equal(source_ids, PAD_ID)  # (B, S), True = real token
    logits = decoder(target_in_ids, encoder(source_ids), source_mask=source_mask)
    return keras.Model([source_ids, target_in_ids], logits, name=name)
