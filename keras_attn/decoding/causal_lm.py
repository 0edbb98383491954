"""Generation with decoder-only language models: greedy, beam, or sampled continuations of a
batch of prompts, one compiled loop over the static cache.

The model's layer named `"decoder"` keeps the decoding contract of
`keras_attn.decoding.contract.Decoder` (`keras_attn.models.TransformerDecoderOnly`, the decoder
of `keras_attn.models.causal_lm`, does).

Prompts are right-padded with 0 (each row at least one token, e.g. `<bos>`); a row's
prompt tokens are kept as they are and its generated tokens follow them.
"""

from __future__ import annotations

from keras import ops

from keras_attn._checks import check_int, check_number, check_one_of
from keras_attn.decoding import choices, compiled, contract, loops
from keras_attn.decoding.seq2seq import check_sampling
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID

STRATEGIES = ("greedy", "sample", "beam")


def _decoder(model):
    return compiled.contract_layer(
        model, "decoder", "a keras_attn causal language model with a layer named 'decoder'")


def _generate(model, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, alpha, *,
              strategy, max_length, eos_id, beam_size, return_attention, return_scores):
    """The whole generation for one batch of prompts."""
    decoder = _decoder(model)
    prompt_ids = ops.cast(prompt_ids, "int32")
    batch, prompt_len = ops.shape(prompt_ids)[0], ops.shape(prompt_ids)[1]
    lengths = ops.sum(ops.cast(ops.not_equal(prompt_ids, PAD_ID), "int32"), axis=1)  # (B,)
    tokens = ops.concatenate(
        [prompt_ids, ops.zeros((batch, max_length - prompt_len), "int32")], axis=1)  # (B, L)
    state = decoder.init_decode_state(batch, max_length)
    # The prompt at once, but for each row's last prompt token, which the loop feeds.
    step = contract.step_function(decoder, return_attention)
    _, state, _ = contract.step_function(decoder, False)(prompt_ids, 0, state)
    limits = ops.minimum(lengths + ops.cast(max_new_tokens, "int32"), max_length)
    banned = (PAD_ID, BOS_ID)
    if strategy == "beam":
        tokens, scores, attention = loops.beam_loop(
            step, state, tokens, lengths, eos_id, banned, beam_size, alpha,
            return_attention)
    else:
        def choose(logits, index):
            if strategy == "greedy":
                return choices.greedy(logits)
            filtered = choices.filter_logits(logits, ops.maximum(temperature, 1e-6), top_k,
                                             top_p)
            return ops.where(temperature > 0, choices.sample(filtered, seed, index),
                             choices.greedy(logits))

        tokens, scores, attention = loops.token_loop(
            step, state, tokens, lengths, eos_id, banned, choose,
            return_attention, alpha, return_scores, limits)
    outputs = (tokens,)
    if return_attention:
        outputs += (attention,)
    if return_scores:
        outputs += (scores,)
    return outputs


def generate(
    model,
    prompt_ids,
    max_length: int,
    max_new_tokens=None,
    strategy: str = "greedy",
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    seed=0,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    eos_id: int = EOS_ID,
    return_attention: bool = False,
    return_scores: bool = False,
    jit_compile: bool = False,
):
    """Continue a batch of prompts with a causal language model.

    Args:
        model: a keras_attn causal LM (a layer `"decoder"` keeping this module's contract),
            e.g. from `keras_attn.models.causal_lm`.
        prompt_ids: integer `(B, P)` prompts, right-padded with 0, each with at least one
            token (e.g. `<bos>`).
        max_length: int, the positions of the cache and of the output, prompt included
            (at least `P + 1`).
        max_new_tokens: optional int or scalar tensor, tokens to add at most per row (not
            with `"beam"`). Defaults to `None` (up to `max_length`).
        strategy: `"greedy"`, `"sample"` or `"beam"`. Defaults to `"greedy"`.
        temperature, top_k, top_p, seed: the sampling filter and seed (see
            `keras_attn.decoding.sample`); scalars or scalar tensors. Defaults to `1.0`, `0`,
            `1.0`, `0`.
        beam_size: int, hypotheses per prompt with `"beam"`. Defaults to `4`.
        length_penalty: float >= 0, GNMT's exponent (beam ranking, scores). Defaults to `0.6`.
        eos_id: int, the end token. Defaults to `keras_attn.tokens.EOS_ID` (3).
        return_attention: bool, also return every step's attention
            `(B, max_length - 1, num_layers, num_heads, max_length)`. Defaults to `False`.
        return_scores: bool, also return each continuation's normalized log-probability
            `(B,)`. Defaults to `False`.
        jit_compile: bool, compile with XLA (TensorFlow). Defaults to `False`.

    Returns:
        int32 `(B, max_length)`: each prompt, then its continuation up to `<eos>` (included),
        then 0; and the attention and scores on request.

    Example:
    >>> tokens = generate(model, [[2, 17, 5, 0], [2, 9, 0, 0]], max_length=32,
    ...                   strategy="sample", temperature=0.8, top_p=0.9, seed=7)
    """
    check_one_of("strategy", strategy, STRATEGIES)
    check_int("max_length", max_length, 2)
    check_int("eos_id", eos_id, 0)
    check_int("beam_size", beam_size, 1)
    check_number("length_penalty", length_penalty, 0)
    prompt_ids = ops.convert_to_tensor(prompt_ids, "int32")
    if len(prompt_ids.shape) != 2:
        raise ValueError(
            "Argument `prompt_ids` must have shape (batch_size, prompt_length). Received: "
            f"prompt_ids.shape={tuple(prompt_ids.shape)}"
        )
    prompt_len = prompt_ids.shape[1]
    if prompt_len is not None and not 0 < prompt_len < max_length:
        raise ValueError(
            f"Argument `max_length` must exceed the prompt length {prompt_len} (it counts the "
            f"prompt). Received: max_length={max_length}"
        )
    if strategy == "beam" and max_new_tokens is not None:
        raise ValueError(
            "Argument `max_new_tokens` is not supported with strategy=\"beam\" (a hypothesis is "
            "ranked over its whole length): set `max_length` instead. Received: "
            f"max_new_tokens={max_new_tokens!r}"
        )
    if max_new_tokens is None:
        max_new_tokens = max_length
    elif isinstance(max_new_tokens, int):
        check_int("max_new_tokens", max_new_tokens, 1)
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                        ("seed", seed)):
        if hasattr(value, "shape") and len(value.shape) != 0:
            raise ValueError(f"Argument `{name}` must be a scalar. Received: {name}={value!r}")
    if not any(hasattr(v, "shape") for v in (temperature, top_k, top_p, seed)):
        check_sampling(temperature, top_k, top_p, seed)
    _decoder(model)
    params = tuple(ops.convert_to_tensor(value, dtype) for value, dtype in (
        (max_new_tokens, "int32"), (temperature, "float32"), (top_k, "int32"),
        (top_p, "float32"), (seed, "int32"), (length_penalty, "float32")))
    outputs = compiled.run(
        _generate, model, (prompt_ids,) + params,
        {"strategy": strategy, "max_length": max_length, "eos_id": eos_id,
         "beam_size": beam_size, "return_attention": bool(return_attention),
         "return_scores": bool(return_scores)}, jit_compile)
    outputs = tuple(outputs)
    return outputs[0] if len(outputs) == 1 else outputs
