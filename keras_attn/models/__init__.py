"""Functional-API model builders: `keras.Model([source_ids, target_in_ids], logits)`.

Every seq2seq builder returns a model with layers named "encoder" and "decoder" that follows
the decoding contract of `keras_attn.decoding`.
"""

from keras_attn.models.bahdanau import bahdanau_seq2seq
from keras_attn.models.transformer import transformer_seq2seq

__all__ = [
    "bahdanau_seq2seq",
    "transformer_seq2seq",
]
