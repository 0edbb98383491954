"""The decoding contract, written once: what a decoder layer keeps so that the loops of
`keras_attn.decoding` (greedy, beam, sampling) run it one token at a time over a static cache.

`keras_attn.models` keeps it in `TransformerDecoder`, `TransformerDecoderOnly` and
`BahdanauDecoder`; any layer with the two methods below can be decoded (the check is
`isinstance(layer, Decoder)`, made by `compiled.contract_layer`).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Protocol, runtime_checkable

from keras_attn._checks import warn_deprecated


@runtime_checkable
class Decoder(Protocol):
    """A layer decoded one token at a time over a state of static shape.

    The state is a nested structure (dicts, tuples) of tensors, each with the batch on axis 0
    and a shape that never changes from step to step (caches preallocated to `max_length`), so
    a loop carries it through `keras.ops.while_loop` and beam search reorders its rows.

    - Sequence-to-sequence models (the layer named `"decoder"`, next to an `"encoder"` called
      as `encoder_outputs = encoder(source_ids)`):
      `state = decoder.init_decode_state(encoder_outputs, source_ids, max_length)`.
    - Causal language models (the layer named `"decoder"` of `keras_attn.models.causal_lm`):
      `state = decoder.init_decode_state(batch_size, max_length)`.

    `logits, state, attention = decoder.decode_step(token_ids, index, state)` then runs
    `token_ids` int32 `(B,)`, the tokens at position `index` (a scalar int32 tensor, 0 for the
    first), through the model: float32 `logits` `(B, vocab_size)` predict position
    `index + 1`; `attention` is that step's attention `(B, ...)` (cross-attention for
    sequence-to-sequence models). A causal language model's decoder also takes `(B, T)`
    tokens at positions `index, ...` (a prompt at once) and returns `(B, T, vocab_size)`.

    A decoder may take `return_attention_scores` (bool, False by default, as keras_attn's
    decoders do; Keras' name): the loops pass `return_attention_scores=True` only when their
    caller asked for the attention; otherwise the decoder need not compute it (it returns None
    in its place). A decoder of keras_attn 0.2's contract, taking `return_attention`, is still
    decoded (with a DeprecationWarning). A decoder may also take
    `return_logits` (bool): a prompt run only to fill the cache then passes
    `return_logits=False`, and the decoder may skip its vocabulary projection (None in place
    of the logits; at GPT-2's 50,257 tokens that projection is a third of the weights).
    """

    def init_decode_state(self, *inputs, max_length: int) -> dict:
        """The state before the first step."""

    def decode_step(self, token_ids, index, state,
                    return_attention_scores: bool = False) -> tuple:
        """`(logits, state, attention)` of one step."""


def step_function(decoder: Decoder, return_attention_scores: bool,
                  return_logits: bool = True):
    """`decoder.decode_step` asking for the attention only when `return_attention_scores`, and
    for the logits only when `return_logits` (for the decoders that take these arguments; the
    others compute them anyway)."""
    parameters = inspect.signature(decoder.decode_step).parameters
    options = {}
    if "return_attention_scores" in parameters:
        options["return_attention_scores"] = bool(return_attention_scores)
    elif "return_attention" in parameters:  # keras_attn 0.2's contract
        warn_deprecated(
            f"{type(decoder).__name__}.decode_step: `return_attention` is "
            "`return_attention_scores` (keras_attn 0.3 names, see CHANGELOG.md).")
        options["return_attention"] = bool(return_attention_scores)
    if not return_logits and "return_logits" in parameters:
        options["return_logits"] = False
    return partial(decoder.decode_step, **options) if options else decoder.decode_step
