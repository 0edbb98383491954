"""Functional-API model builders.

Every seq2seq builder returns `keras.Model([source_ids, target_in_ids], logits)` with layers
named "encoder" and "decoder" that follow the decoding contract of `keras_attn.decoding`;
`causal_lm` returns `keras.Model(token_ids, logits)` with a "decoder" that `generate` decodes;
the non-autoregressive `nat_seq2seq` returns `keras.Model([source_ids, masked_target_ids],
[token_logits, length_logits])`, which `keras_attn.decoding.mask_predict` decodes.
"""

from keras_attn.models.bahdanau import bahdanau_seq2seq
from keras_attn.models.causal_lm import causal_lm
from keras_attn.models.nat import compile_cmlm, nat_seq2seq
from keras_attn.models.transformer import transformer_seq2seq

__all__ = [
    "bahdanau_seq2seq",
    "causal_lm",
    "compile_cmlm",
    "nat_seq2seq",
    "transformer_seq2seq",
]
