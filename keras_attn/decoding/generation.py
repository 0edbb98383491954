"""`generate`: one function decodes every keras_attn model that keeps the decoding contract,
causal language models (prompts in, prompts and continuations out) and sequence-to-sequence
models (source ids in, target ids out), with a sampler (`keras_attn.decoding.samplers`).

keras_attn 0.2's functions (`greedy_search`, `beam_search`, `sample`) and spellings
(`strategy=`, `eos_id=`, ...) keep working for one release, deprecated
(`keras_attn.decoding.legacy`).
"""

from __future__ import annotations

from keras_attn._checks import check_number
from keras_attn.decoding import (
    causal_lm,
    checks,
    compiled,
    legacy,
    samplers,
    seq2seq,
    speculative,
)
from keras_attn.decoding.special import special_ids
from keras_attn.tokens import BOS_ID, EOS_ID


def run(model, inputs, max_length, *, sampler, stop_token_ids=EOS_ID, max_new_tokens=None,
        return_attention_scores=False, return_scores=False, jit_compile=None, pad_id=None,
        bos_id=BOS_ID, suppressed_ids=None, prompt_lengths=None, alpha=None, on_step=None,
        draft=None, draft_tokens=None, return_acceptance=False):
    """`generate` with today's arguments only; `alpha` (optional) overrides the scores'
    length-penalty exponent (keras_attn 0.2's spellings); `on_step` (causal models, one
    token at a time) is called with the loop's variables after each token
    (`keras_attn.decoding.stepwise.compiling`), True stopping the loop: what streaming
    (`CausalLM.generate(..., stream=True)`) reads."""
    if jit_compile is not None and not isinstance(jit_compile, bool):
        raise ValueError("Received an invalid value for argument `jit_compile`, expected a "
                         f"bool or None. Received: jit_compile={jit_compile!r}")
    if not isinstance(return_acceptance, bool):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Received an invalid value for argument `return_acceptance`, expected a bool. "
            f"Received: return_acceptance={return_acceptance!r}")
    sampler = samplers.get(sampler)
    if draft is not None or draft_tokens is not None or return_acceptance:
        return _speculative(model, inputs, max_length, sampler, draft, draft_tokens,
                            return_acceptance, stop_token_ids=stop_token_ids,
                            max_new_tokens=max_new_tokens,
                            return_attention_scores=return_attention_scores,
                            return_scores=return_scores, jit_compile=jit_compile,
                            pad_id=pad_id, bos_id=bos_id, suppressed_ids=suppressed_ids,
                            prompt_lengths=prompt_lengths, alpha=alpha, on_step=on_step)
    beam = sampler.beam()
    if alpha is None:
        alpha = beam.length_penalty if beam is not None else 0.0
    alpha = checks.as_tensor(alpha, integer=False)
    ids = special_ids(model, stop_token_ids=stop_token_ids, pad_id=pad_id, bos_id=bos_id,
                      suppressed_ids=suppressed_ids)
    if compiled.has_layer(model, "encoder"):
        for name, value in (("max_new_tokens", max_new_tokens),
                            ("prompt_lengths", prompt_lengths), ("on_step", on_step)):
            if value is not None:
                raise ValueError(
                    f"Argument `{name}` applies to causal language models; a "
                    "sequence-to-sequence model's outputs are `max_length` tokens long. "
                    f"Received: {name}={value!r}")
        outputs = seq2seq.run(model, inputs, max_length, sampler, ids, alpha,
                              return_attention_scores, return_scores, jit_compile)
    else:
        outputs = causal_lm.run(model, inputs, max_length, sampler, ids, alpha, max_new_tokens,
                                prompt_lengths, return_attention_scores, return_scores,
                                jit_compile, on_step)
    return outputs[0] if len(outputs) == 1 else outputs


def _speculative(model, inputs, max_length, sampler, draft, draft_tokens, return_acceptance,
                 stop_token_ids, max_new_tokens, jit_compile, pad_id, bos_id, suppressed_ids,
                 prompt_lengths, **unsupported):
    """`run` with a draft model (`keras_attn.decoding.speculative`)."""
    if draft is None:
        name = "draft_tokens" if draft_tokens is not None else "return_acceptance"
        value = draft_tokens if draft_tokens is not None else return_acceptance
        raise ValueError(f"Argument `{name}` applies to speculative decoding: give a `draft` "
                         f"model too. Received: {name}={value!r}, draft=None")
    if compiled.has_layer(model, "encoder"):
        raise ValueError(
            "Argument `draft` applies to causal language models; this `model` has an "
            f"'encoder' (a sequence-to-sequence model). Received: draft={draft!r}")
    for name, value in unsupported.items():
        if value not in (None, False):
            raise ValueError(
                f"Argument `{name}` is not supported with a `draft` (speculative decoding "
                f"returns the tokens, and their acceptance). Received: {name}={value!r}")
    ids = special_ids(model, stop_token_ids=stop_token_ids, pad_id=pad_id, bos_id=bos_id,
                      suppressed_ids=suppressed_ids)
    tokens, acceptance = speculative.run(model, draft, inputs, max_length, sampler, ids,
                                         max_new_tokens, prompt_lengths, draft_tokens,
                                         jit_compile)
    return (tokens, acceptance) if return_acceptance else tokens


def generate(model, inputs, max_length: int, *args, sampler="greedy", stop_token_ids=EOS_ID,
             max_new_tokens=None, return_attention_scores: bool = False,
             return_scores: bool = False, jit_compile: bool | None = None, pad_id: int | None = None,
             bos_id: int = BOS_ID, suppressed_ids=None, prompt_lengths=None, draft=None,
             draft_tokens: int | None = None, return_acceptance: bool = False, **kwargs):
    """Decode a batch with a causal language model or a sequence-to-sequence model.

    A causal language model (a layer `"decoder"`, e.g. `keras_attn.models.causal_lm`, a
    checkpoint's `build_model`) continues each prompt; a sequence-to-sequence model (layers
    `"encoder"` and `"decoder"`, `keras_attn.models.transformer_seq2seq`, ...) translates each
    source. Both run as one compiled loop over the decoder's static cache, compiled once per
    model and kind of sampler (its numbers are inputs of the program).

    Args:
        model: the model (its `"decoder"` keeps `keras_attn.decoding.contract.Decoder`).
        inputs: integer `(B, P)` ids: prompts, right-padded with the padding id (each row
            its tokens, at least one, e.g. `<bos>`, then only padding; `special_ids`), or
            sources (0 = padding). Ids outside the vocabulary and prompts padded otherwise
            are refused (a ValueError, or a failed call for a tensor whose value is known
            only when the graph runs; `keras_attn.decoding.checks`).
        max_length: int, the length of the returned sequences: a causal model's prompt and
            continuation (at least `P + 1`), a sequence-to-sequence model's output positions
            (`<bos>` excluded); at most `2**31 - 2`.
        sampler: how each token is chosen: a name (`"greedy"`, `"beam"`, `"random"`,
            `"top_k"`, `"top_p"`, `"min_p"`), a config or a sampler of
            `keras_attn.decoding.samplers` (`Beam(4)`, `TopP(0.9, seed=7)`,
            `RepetitionPenalty(1.3, "greedy")`, ...). Defaults to `"greedy"`.
        stop_token_ids: the ids that end a row: an int, a tuple (a checkpoint's several end
            ids) or None (every row runs to its limit); tokens the model can emit. Defaults to
            keras_attn's `<eos>` (3).
        max_new_tokens: optional positive int or scalar int tensor (causal models, one token
            at a time), tokens added per row at most; any value from `max_length` up (e.g.
            `2**31 - 1`) is the same as None. Defaults to `None` (up to `max_length`).
        return_attention_scores: bool, also return every step's attention (cross-attention
            for sequence-to-sequence models), zero after a row's end: `(B, max_length - 1,
            num_layers, num_heads, max_length)` for a causal Transformer, `(B, max_length,
            num_layers, num_heads, S)` for a sequence-to-sequence one. Defaults to `False`.
        return_scores: bool, also return each row's score `(B,)`: the log-probability of its
            chosen tokens under the model, divided by GNMT's `((5 + |Y|) / 6) ** alpha` with a
            `Beam`'s `length_penalty` as `alpha` (the quantity it ranks by; 0, the plain
            log-probability, for other samplers). Defaults to `False`.
        jit_compile: bool or None. TensorFlow: `True` compiles the loop with XLA (else a
            `tf.function`). torch: `True` compiles each token's step with `torch.compile`
            (once per model and settings), `False` runs it eagerly, None compiles on a GPU
            only (`keras_attn.decoding.compiled.torch_mode`). JAX always compiles the whole
            loop (`jax.jit`). Defaults to `None`.
        pad_id, bos_id, suppressed_ids: the special ids (`special_ids`): the prompts' padding,
            the start token, the ids never generated. Default to the model's (`None`,
            keras_attn's `<bos>` 2, `None`).
        prompt_lengths: optional integer `(B,)` (causal models), each row's prompt length in
            `[1, P]`: the ids after it are ignored, whatever they are. Defaults to `None` (the
            tokens before the trailing padding).
        draft: optional causal language model with the same vocabulary (a smaller one):
            speculative decoding (`keras_attn.decoding.speculative`), the draft proposing
            `draft_tokens` tokens that the model verifies in one pass over its cache; the
            output is the model's own greedy output (greedy samplers), or draws from its
            distribution (`Random`, `TopK`, `TopP`, `MinP`). Causal models, one token at a
            time, without `return_attention_scores` or `return_scores`. Defaults to `None`.
        draft_tokens: optional int in `[1, max_length - 1]`, tokens the draft proposes per
            round (with `draft`). Defaults to `None` (4).
        return_acceptance: bool (with `draft`), also return the share of drafted tokens the
            model kept, a float. Defaults to `False`.

    Returns:
        int32 `(B, max_length)`: a causal model's prompts, then their continuations up to a
        stop id (included), then the padding id; a sequence-to-sequence model's outputs up to
        a stop id, then padding. With `return_attention_scores` and `return_scores`, also the
        attention and the scores, in this order; with `return_acceptance`, `(tokens,
        acceptance)`.

    Example:
    >>> tokens = generate(lm, [[2, 17, 5, 0], [2, 9, 0, 0]], 32,
    ...                   sampler=samplers.TopP(0.9, temperature=0.8, seed=7))
    >>> outputs = generate(translator, source_ids, 20, sampler="beam")  # (B, 20)
    >>> tokens, acceptance = generate(lm, prompt_ids, 64, draft=small_lm, draft_tokens=4,
    ...                               return_acceptance=True)
    """
    options = {"sampler": sampler, "stop_token_ids": stop_token_ids,
               "max_new_tokens": max_new_tokens,
               "return_attention_scores": return_attention_scores,
               "return_scores": return_scores, "jit_compile": jit_compile, "pad_id": pad_id,
               "bos_id": bos_id, "suppressed_ids": suppressed_ids,
               "prompt_lengths": prompt_lengths, "draft": draft,
               "draft_tokens": draft_tokens, "return_acceptance": return_acceptance}
    if args or kwargs:
        defaults = {name: generate.__kwdefaults__[name] for name in options}
        for name, value in legacy.generate_options("generate", args, kwargs).items():
            if name in options and options[name] is not defaults[name]:
                raise ValueError(
                    f"Argument `{name}` was given twice, by keras_attn 0.2's spelling and by "
                    f"today's: give `{name}` only. Received: {name}={options[name]!r}")
            options[name] = value
    return run(model, inputs, max_length, **options)


def greedy_search(model, source_ids, max_length: int, bos_id: int = BOS_ID,
                  eos_id: int | None = EOS_ID, return_attention: bool = False,
                  jit_compile: bool = False, return_scores: bool = False,
                  length_penalty: float = 0.6):
    """Deprecated: `generate(model, source_ids, max_length, sampler="greedy",
    stop_token_ids=eos_id, ...)` (the scores normalized by `length_penalty`, as before)."""
    legacy.warn_function("greedy_search", "generate(..., sampler=\"greedy\")")
    check_number("length_penalty", length_penalty, 0)
    return _seq2seq(model, source_ids, max_length, samplers.Greedy(), bos_id, eos_id,
                    return_attention, jit_compile, return_scores, length_penalty)


def beam_search(model, source_ids, max_length: int, beam_size: int = 4,
                length_penalty: float = 0.6, bos_id: int = BOS_ID,
                eos_id: int | None = EOS_ID, return_attention: bool = False,
                jit_compile: bool = False, return_scores: bool = False):
    """Deprecated: `generate(model, source_ids, max_length,
    sampler=Beam(beam_size, length_penalty), stop_token_ids=eos_id, ...)`."""
    legacy.warn_function("beam_search", "generate(..., sampler=Beam(beam_size))")
    return _seq2seq(model, source_ids, max_length, samplers.Beam(beam_size, length_penalty),
                    bos_id, eos_id, return_attention, jit_compile, return_scores, None)


def sample(model, source_ids, max_length: int, temperature=1.0, top_k=0, top_p=1.0, seed=0,
           bos_id: int = BOS_ID, eos_id: int | None = EOS_ID, return_attention: bool = False,
           jit_compile: bool = False, return_scores: bool = False,
           length_penalty: float = 0.6):
    """Deprecated: `generate(model, source_ids, max_length, sampler=TopP(p=top_p, k=top_k,
    temperature=temperature, seed=seed), stop_token_ids=eos_id, ...)` (the same draws)."""
    legacy.warn_function("sample", "generate(..., sampler=TopP(top_p, top_k, temperature, "
                                   "seed))")
    check_number("length_penalty", length_penalty, 0)
    sampler = samplers.TopP(p=top_p, k=top_k, temperature=temperature, seed=seed)
    return _seq2seq(model, source_ids, max_length, sampler, bos_id, eos_id, return_attention,
                    jit_compile, return_scores, length_penalty)


def _seq2seq(model, source_ids, max_length, sampler, bos_id, eos_id, return_attention,
             jit_compile, return_scores, alpha):
    seq2seq.decoder_parts(model)  # a sequence-to-sequence model, or a ValueError saying so
    return run(model, source_ids, max_length, sampler=sampler, stop_token_ids=eos_id,
               return_attention_scores=return_attention, return_scores=return_scores,
               jit_compile=jit_compile, bos_id=bos_id, alpha=alpha)
