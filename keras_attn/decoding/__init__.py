"""Decoding over a static key/value cache, on `keras.ops` (TensorFlow, JAX and torch).

- `greedy_search`, `beam_search`, `sample`: sequence-to-sequence models (`seq2seq`);
- `mask_predict`: parallel decoding of non-autoregressive models (`nat_seq2seq`);
- `generate`: continuations of prompts by causal language models (`causal_lm`);
- `loops`: the greedy/sampling and beam loops, which know no model;
- `choices`: the most likely token, or a seeded sample (temperature, top-k, top-p);
- `compiled`: one compiled program per model and settings;
- `checks`: what the functions are given (settings, token ids, lengths, the end token),
  checked in Python when the values are known, in the compiled program when they are not.
"""

from keras_attn.decoding.causal_lm import generate
from keras_attn.decoding.mask_predict import mask_predict
from keras_attn.decoding.seq2seq import beam_search, greedy_search, sample

__all__ = ["beam_search", "generate", "greedy_search", "mask_predict", "sample"]
