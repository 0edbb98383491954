"""Decoding causal language models: a batch of prompts continued, one compiled loop over the
static cache (`keras_attn.decoding.generate` runs it).

The model's layer named `"decoder"` keeps the decoding contract of
`keras_attn.decoding.contract.Decoder` (`keras_attn.models.TransformerDecoderOnly`, the decoder
of `keras_attn.models.causal_lm`, does).

Prompts are right-padded with the padding id (`keras_attn.decoding.special_ids`: by default the
model's own, 0 for `causal_lm`; a pretrained checkpoint's own,
`keras_attn.checkpoints.generation_ids`), or their lengths are given (`prompt_lengths`); a
model without a padding id takes every prompt position as a token; each row has at least one
token, e.g. `<bos>`. A row's prompt tokens are kept as they are and its generated tokens follow
them. Other layouts are refused, not guessed at: left padding would need a padding mask over the
cache, which the contract does not carry.
"""

from __future__ import annotations

from keras import ops

from keras_attn.decoding import checks, compiled, contract, loops


def decoder(model):
    """`model`'s layer `"decoder"`, checked against the contract."""
    kind = "a keras_attn causal language model with a layer named 'decoder'"
    if compiled.has_layer(model, "encoder"):
        raise ValueError(
            f"Argument `model` must be {kind}; this one has an 'encoder' (a sequence-to-"
            f"sequence model). Received: model={model!r}")
    return compiled.contract_layer(model, "decoder", kind)


def cache_length(max_length: int, limit: int | None = None) -> int:
    """The static cache length that decodes up to `max_length` positions: `max_length`
    rounded up to a multiple of a quarter of its power of two (8 at least), at most `limit`
    (the model's positions) and never below `max_length`. Lengths of one bucket share one
    compiled program, so a new `max_length` seldom compiles (or retraces) again; the cache
    is at most a quarter (or 7 positions) longer than asked."""
    step = max(8, 1 << max(int(max_length - 1).bit_length() - 3, 0))
    bucket = -(-max_length // step) * step
    return max(max_length, min(bucket, limit)) if limit is not None else bucket


def _generate(model, prompt_ids, lengths, max_new_tokens, end, alpha, *numbers, sampler,
              max_length, stop_token_ids, fill_id, suppressed_ids, return_attention_scores,
              return_scores):
    """The whole generation for one batch of prompts, in a cache of `max_length` positions;
    a row ends by position `end` (a scalar tensor, at most `max_length`: the positions from
    `end` on stay `fill_id`)."""
    layer = decoder(model)
    prompt_ids = ops.cast(prompt_ids, "int32")
    batch, prompt_len = ops.shape(prompt_ids)[0], ops.shape(prompt_ids)[1]
    lengths = ops.cast(lengths, "int32")  # (B,)
    tokens = ops.concatenate(
        [prompt_ids, ops.full((batch, max_length - prompt_len), fill_id, "int32")],
        axis=1)  # (B, L)
    state = layer.init_decode_state(batch, max_length)
    # The prompt at once, only into the cache: the loop feeds each row's last prompt token
    # again and reads its logits then (so the prompt pass skips the vocabulary projection).
    step = contract.step_function(layer, return_attention_scores)
    _, state, _ = contract.step_function(layer, False, return_logits=False)(
        prompt_ids, 0, state)
    # Each row ends at its prompt length plus `max_new_tokens`, or at `max_length`; written
    # so that no sum can exceed int32 (`max_new_tokens` may be 2**31 - 1).
    end = ops.cast(end, "int32")
    limits = lengths + ops.minimum(max_new_tokens, end - lengths)  # (B,)
    ids = {"stop_token_ids": stop_token_ids, "suppressed_ids": suppressed_ids,
           "fill_id": fill_id}
    tokens, scores, attention = loops.search(
        step, state, tokens, lengths, sampler.bind(numbers), ids, alpha,
        return_attention_scores, return_scores, limits)
    outputs = (tokens,)
    if return_attention_scores:
        outputs += (attention,)
    if return_scores:
        outputs += (scores,)
    return outputs


def prompts(model, prompt_ids, max_length: int, ids: dict, prompt_lengths) -> tuple:
    """The prompts checked, as `(prompt_ids (B, P), prompt_lengths int32 (B,))` (`ids` of
    `special_ids`; `prompt_lengths` given or None: read from the padding)."""
    layer = decoder(model)
    padding = ids["pad_id"]
    prompt_ids = checks.token_ids(
        "inputs", prompt_ids, checks.vocabulary_size(layer),
        right_padded=prompt_lengths is None and padding is not None, pad_id=padding or 0)
    if prompt_lengths is None and padding is None:  # no padding id: every position a token
        prompt_lengths = ops.full((ops.shape(prompt_ids)[0],), ops.shape(prompt_ids)[1],
                                  "int32")
    elif prompt_lengths is None:  # the tokens before the trailing padding
        prompt_lengths = ops.sum(ops.cast(ops.not_equal(prompt_ids, padding), "int32"), axis=1)
    else:
        prompt_lengths = checks.prompt_lengths(prompt_lengths, prompt_ids)
    prompt_len = prompt_ids.shape[1]
    if prompt_len is not None and not 0 < prompt_len < max_length:
        raise ValueError(
            f"Argument `max_length` must exceed the prompt length {prompt_len} (it counts the "
            f"prompt). Received: max_length={max_length}")
    return prompt_ids, prompt_lengths


def new_tokens(max_new_tokens, max_length: int):
    """`max_new_tokens` checked, as an int32 scalar tensor (None: `max_length`)."""
    (max_new_tokens,) = checks.settings(
        caps={"max_new_tokens": max_length},
        max_new_tokens=max_length if max_new_tokens is None else max_new_tokens).values()
    return max_new_tokens


def run(model, prompt_ids, max_length: int, sampler, ids: dict, alpha, max_new_tokens,
        prompt_lengths, return_attention_scores: bool, return_scores: bool,
        jit_compile: bool, on_step=None) -> tuple:
    """`generate` for a causal language model, its arguments checked (`ids` of
    `special_ids`, `alpha` the scores' length-penalty exponent, a float32 scalar tensor;
    `on_step` the loop's callback, `keras_attn.decoding.stepwise.compiling`: streaming)."""
    checks.length("max_length", max_length, 2)
    prompt_ids, prompt_lengths = prompts(model, prompt_ids, max_length, ids, prompt_lengths)
    beam = sampler.beam()
    if beam is not None and beam.num_beams > 1 and max_new_tokens is not None:
        raise ValueError(
            "Argument `max_new_tokens` is not supported with beam search (a hypothesis is "
            "ranked over its whole length): set `max_length` instead. Received: "
            f"max_new_tokens={max_new_tokens!r}")
    max_new_tokens = new_tokens(max_new_tokens, max_length)
    # One token at a time (not beam search, whose hypotheses are ranked over the whole
    # length), without per-position outputs: decoded in a cache of a bucket's length.
    bucketed = (beam is None or beam.num_beams == 1) and not (return_attention_scores or
                                                              return_scores)
    limit = getattr(decoder(model), "max_sequence_length", None)
    length = cache_length(int(max_length), limit) if bucketed else int(max_length)
    options = {"sampler": sampler, "max_length": length,
               "stop_token_ids": ids["stop_token_ids"], "fill_id": ids["fill_id"],
               "suppressed_ids": ids["suppressed_ids"],
               "return_attention_scores": bool(return_attention_scores),
               "return_scores": bool(return_scores)}
    arrays = (prompt_ids, prompt_lengths, max_new_tokens,
              ops.convert_to_tensor(int(max_length), "int32"), alpha) + sampler.tensors()
    outputs = compiled.run(_generate, model, arrays, options, jit_compile, on_step)
    return (outputs[0][:, :max_length],) + tuple(outputs[1:])
