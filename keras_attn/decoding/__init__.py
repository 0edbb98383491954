"""Decoding over a static key/value cache, on `keras.ops` (TensorFlow, JAX and torch).

- `generate(model, inputs, max_length, *, sampler=..., stop_token_ids=...)`: one function for
  causal language models (prompts continued) and sequence-to-sequence models (sources
  translated), `max_length` the length of the returned sequences;
- `samplers`: how each token is chosen, as small serializable objects (`Greedy`, `Beam`,
  `Random`, `TopK`, `TopP`, `MinP`, `RepetitionPenalty`; `samplers.get`);
- `special_ids`: the stop, padding, start and never-generated ids, derived once from the model;
- `mask_predict`: parallel decoding of non-autoregressive models (`nat_seq2seq`);
- `speculative`: a draft model proposing tokens that the model verifies in one pass over its
  cache (`generate(..., draft=draft, draft_tokens=4)`);
- `loops`: the one-token-at-a-time and beam loops, which know no model; `choices`: the tensor
  functions of the samplers (filters, penalty, seeded draws);
- `causal_lm`, `seq2seq`: what `generate` runs for each kind of model; `compiled`: one
  compiled program per model and kind of sampler; `contract`: what a decoder keeps;
- `checks`: what the functions are given, checked in Python when the values are known, in the
  compiled program when they are not;
- `legacy`: keras_attn 0.2's spellings (`greedy_search`, `beam_search`, `sample`,
  `strategy=`, `eos_id=`, `return_attention=`), deprecated for one release.
"""

from keras_attn.decoding import samplers
from keras_attn.decoding.generation import beam_search, generate, greedy_search, sample
from keras_attn.decoding.mask_predict import mask_predict
from keras_attn.decoding.samplers import (
    Beam,
    Greedy,
    MinP,
    Random,
    RepetitionPenalty,
    Sampler,
    TopK,
    TopP,
)
from keras_attn.decoding.special import special_ids

__all__ = ["Beam", "Greedy", "MinP", "Random", "RepetitionPenalty", "Sampler", "TopK", "TopP",
           "beam_search", "generate", "greedy_search", "mask_predict", "sample", "samplers",
           "special_ids"]
