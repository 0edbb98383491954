"""Decoding keras_attn sequence-to-sequence models: source ids in, target ids out.

The model has a layer named `"encoder"`, called as `encoder_outputs = encoder(source_ids)`, and a
layer named `"decoder"` that keeps the decoding contract of `keras_attn.decoding.contract.Decoder`
(every `keras_attn.models` seq2seq builder's does). `keras_attn.decoding.generate` runs it: the
whole batch in one loop (`keras_attn.decoding.loops`), compiled once per model and sampler kind
(`keras_attn.decoding.compiled`). Padding and `<bos>` are never emitted.
"""

from __future__ import annotations

from keras import ops

from keras_attn.decoding import checks, compiled, contract, loops


def decoder_parts(model):
    """The `"encoder"` and `"decoder"` layers of `model`, checked against the contract."""
    kind = "a keras_attn seq2seq model with layers named 'encoder' and 'decoder'"
    return (compiled.contract_layer(model, "encoder", kind, methods=()),
            compiled.contract_layer(model, "decoder", kind))


def _decode(model, source_ids, alpha, *numbers, sampler, max_length, stop_token_ids, fill_id,
            bos_id, suppressed_ids, return_attention_scores, return_scores):
    """The whole search for one batch: encode, then decode `max_length` tokens."""
    encoder, decoder = decoder_parts(model)
    source_ids = ops.cast(source_ids, "int32")
    batch = ops.shape(source_ids)[0]
    state = decoder.init_decode_state(encoder(source_ids), source_ids, max_length)
    tokens = ops.concatenate([ops.full((batch, 1), bos_id, "int32"),
                              ops.full((batch, max_length), fill_id, "int32")],
                             axis=1)  # (B, L + 1)
    step = contract.step_function(decoder, return_attention_scores)
    ids = {"stop_token_ids": stop_token_ids, "suppressed_ids": suppressed_ids,
           "fill_id": fill_id}
    tokens, scores, attention = loops.search(
        step, state, tokens, ops.ones((batch,), "int32"), sampler.bind(numbers), ids, alpha,
        return_attention_scores, return_scores)
    outputs = (tokens[:, 1:],)
    if return_attention_scores:
        outputs += (ops.cast(attention, "float32"),)
    return outputs + ((scores,) if return_scores else ())


def run(model, source_ids, max_length: int, sampler, ids: dict, alpha,
        return_attention_scores: bool, return_scores: bool, jit_compile: bool) -> tuple:
    """`generate` for a sequence-to-sequence model, its arguments checked (`ids` of
    `special_ids`, `alpha` the scores' length-penalty exponent, a float32 scalar tensor)."""
    checks.length("max_length", max_length, 1)
    encoder, _ = decoder_parts(model)
    source_ids = checks.token_ids("inputs", source_ids, checks.vocabulary_size(encoder))
    options = {"sampler": sampler, "max_length": int(max_length),
               "stop_token_ids": ids["stop_token_ids"], "fill_id": ids["fill_id"],
               "bos_id": ids["bos_id"], "suppressed_ids": ids["suppressed_ids"],
               "return_attention_scores": bool(return_attention_scores),
               "return_scores": bool(return_scores)}
    return tuple(compiled.run(_decode, model, (source_ids, alpha) + sampler.tensors(),
                              options, jit_compile))
