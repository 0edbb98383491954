"""Generation with decoder-only language models: greedy, beam, or sampled continuations of a
batch of prompts, one compiled loop over the static cache.

The model's layer named `"decoder"` keeps the decoding contract of
`keras_attn.decoding.contract.Decoder` (`keras_attn.models.TransformerDecoderOnly`, the decoder
of `keras_attn.models.causal_lm`, does).

Prompts are right-padded with `pad_id` (by default the model's own: 0, keras_attn's padding,
for `causal_lm`; a pretrained checkpoint's own, `keras_attn.checkpoints.generation_ids`), or
their lengths are given (`prompt_lengths`); a model without a padding id (`pad_id=None`) takes
every prompt position as a token;
each row has at least one token, e.g. `<bos>`. A row's prompt tokens are kept as they are and
its generated tokens follow them. Other layouts are refused, not guessed at: left padding
would need a padding mask over the cache, which the contract does not carry.
"""

from __future__ import annotations

from keras import ops

from keras_attn._checks import check_int, check_number, check_one_of
from keras_attn.decoding import checks, choices, compiled, contract, loops
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID

STRATEGIES = ("greedy", "sample", "beam")


def _decoder(model):
    kind = "a keras_attn causal language model with a layer named 'decoder'"
    if compiled.has_layer(model, "encoder"):
        raise ValueError(
            f"Argument `model` must be {kind}; this one has an 'encoder' (a sequence-to-"
            "sequence model: decode it with keras_attn.decoding.greedy_search, beam_search or "
            f"sample). Received: model={model!r}")
    return compiled.contract_layer(model, "decoder", kind)


def _generate(model, prompt_ids, lengths, max_new_tokens, temperature, top_k, top_p, seed,
              alpha, *, strategy, max_length, eos_id, beam_size, return_attention, return_scores,
              pad_id=PAD_ID, suppressed_ids=(PAD_ID, BOS_ID)):
    """The whole generation for one batch of prompts."""
    decoder = _decoder(model)
    prompt_ids = ops.cast(prompt_ids, "int32")
    batch, prompt_len = ops.shape(prompt_ids)[0], ops.shape(prompt_ids)[1]
    lengths = ops.cast(lengths, "int32")  # (B,)
    tokens = ops.concatenate(
        [prompt_ids, ops.full((batch, max_length - prompt_len), pad_id, "int32")],
        axis=1)  # (B, L)
    state = decoder.init_decode_state(batch, max_length)
    # The prompt at once, only into the cache: the loop feeds each row's last prompt token
    # again and reads its logits then (so the prompt pass skips the vocabulary projection).
    step = contract.step_function(decoder, return_attention)
    _, state, _ = contract.step_function(decoder, False, return_logits=False)(
        prompt_ids, 0, state)
    # Each row ends at its prompt length plus `max_new_tokens`, or at `max_length`; written
    # so that no sum can exceed int32 (`max_new_tokens` may be 2**31 - 1).
    limits = lengths + ops.minimum(max_new_tokens, max_length - lengths)  # (B,)
    banned = tuple(suppressed_ids)
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
            return_attention, alpha, return_scores, limits, pad_id=pad_id)
    outputs = (tokens,)
    if return_attention:
        outputs += (attention,)
    if return_scores:
        outputs += (scores,)
    return outputs


def _padding(decoder, pad_id) -> int | None:
    """The id that right-pads the prompts: an explicit `pad_id`, else the model's own
    (`decoder.pad_id`; keras_attn's 0 for a decoder without the attribute); None: none does."""
    if pad_id is not None:
        check_int("pad_id", pad_id, 0)
        return int(pad_id)
    own = getattr(decoder, "pad_id", PAD_ID)
    return None if own is None else int(own)


def _filler(padding: int | None, strategy: str, eos_id) -> int:
    """The id written after a row's end: the padding id; without one the first end id (as
    `transformers` pads), or 0 (no end id; beam search extends finished hypotheses with 0)."""
    if padding is not None:
        return padding
    if strategy == "beam" or eos_id is None:
        return PAD_ID
    return eos_id[0] if isinstance(eos_id, tuple) else eos_id


def _suppressed(suppressed_ids, pad_id: int | None, vocab_size) -> tuple:
    """The ids never generated: by default keras_attn's padding and `<bos>`, nothing for a
    model without a padding id."""
    if suppressed_ids is None:
        return () if pad_id is None else (pad_id, BOS_ID)
    ids = tuple(suppressed_ids) if isinstance(suppressed_ids, (tuple, list)) else None
    if ids is None or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i and (
                vocab_size is None or i < vocab_size) for i in ids):
        raise ValueError(
            "Received an invalid value for argument `suppressed_ids`, expected None or a tuple "
            f"of token ids in [0, {vocab_size}). Received: suppressed_ids={suppressed_ids!r}")
    return ids


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
    eos_id: int | None = EOS_ID,
    return_attention: bool = False,
    return_scores: bool = False,
    jit_compile: bool = False,
    pad_id: int | None = None,
    suppressed_ids=None,
    prompt_lengths=None,
):
    """Continue a batch of prompts with a causal language model.

    Args:
        model: a keras_attn causal LM (a layer `"decoder"` keeping this module's contract),
            e.g. from `keras_attn.models.causal_lm`.
        prompt_ids: integer `(B, P)` prompts, right-padded with 0: each row its tokens, at
            least one (e.g. `<bos>`), then only 0. Left padding, a 0 between tokens, an
            all-padding row and ids outside the vocabulary are refused (module docstring of
            `keras_attn.decoding.checks`: a ValueError, or a failed call for a tensor whose
            value is known only when the graph runs).
        max_length: int, the positions of the cache and of the output, prompt included
            (at least `P + 1`, at most `2**31 - 2`).
        max_new_tokens: optional positive int or scalar int tensor, tokens to add at most per
            row (not with `"beam"`); any value from `max_length` up (e.g. `2**31 - 1`) is the
            same as `None`. Defaults to `None` (up to `max_length`).
        strategy: `"greedy"`, `"sample"` or `"beam"`. Defaults to `"greedy"`.
        temperature, top_k, top_p, seed: the sampling filter and seed (see
            `keras_attn.decoding.sample`); scalars or scalar tensors, checked whatever the
            strategy: a NaN, negative or out-of-range value is refused (Python values and
            eager tensors: ValueError; tensors inside a graph: the call fails with the same
            message), never replaced. Defaults to `1.0`, `0`, `1.0`, `0`.
        beam_size: int, hypotheses per prompt with `"beam"`. Defaults to `4`.
        length_penalty: float >= 0, GNMT's exponent (beam ranking, scores). Defaults to `0.6`.
        eos_id: int, the end token, a token the model can emit (below its vocabulary size,
            not one of `suppressed_ids`), or a tuple of such (a pretrained checkpoint's several
            end ids); `None`: no end token, every row runs to its limit. Defaults to
            `keras_attn.tokens.EOS_ID` (3).
        return_attention: bool, also return every step's attention
            `(B, max_length - 1, num_layers, num_heads, max_length)`. Defaults to `False`.
        return_scores: bool, also return each continuation's normalized log-probability
            `(B,)`. Defaults to `False`.
        jit_compile: bool, compile with XLA (TensorFlow). Defaults to `False`.
        pad_id: optional int, the id that right-pads `prompt_ids` and follows a row's end
            (a pretrained checkpoint's own, `keras_attn.checkpoints.generation_ids`; it may be
            a real token, e.g. the end id: only trailing ones count as padding). Defaults to
            `None`: the model's own padding id (`causal_lm(pad_id=...)`, keras_attn's 0 by
            default); for a model without one (`pad_id=None`, e.g. from
            `keras_attn.checkpoints.build_model`) every prompt position is a token (or
            `prompt_lengths` says where each row ends) and a row's end is followed by its
            first end id (0 when there is none, and with `"beam"`).
        suppressed_ids: optional tuple of ids never generated. Defaults to `None`:
            keras_attn's reserved padding and `<bos>` (`(pad_id, BOS_ID)`); nothing (`()`)
            for a model without a padding id; a pretrained checkpoint's ids are all
            generated (`()`).
        prompt_lengths: optional integer `(B,)`, each row's prompt length (in `[1, P]`):
            the ids after it are ignored, whatever they are (no id then counts as padding,
            e.g. when the end id that pads a checkpoint's prompts may also end a prompt).
            Defaults to `None` (the tokens before the trailing `pad_id`s).

    Returns:
        int32 `(B, max_length)`: each prompt, then its continuation up to `<eos>` (included),
        then the padding id (`pad_id`); and the attention and scores on request.

    Example:
    >>> tokens = generate(model, [[2, 17, 5, 0], [2, 9, 0, 0]], max_length=32,
    ...                   strategy="sample", temperature=0.8, top_p=0.9, seed=7)
    """
    check_one_of("strategy", strategy, STRATEGIES)
    checks.length("max_length", max_length, 2)
    check_int("beam_size", beam_size, 1)
    check_number("length_penalty", length_penalty, 0)
    max_length, beam_size = int(max_length), int(beam_size)
    decoder = _decoder(model)
    if isinstance(eos_id, list):
        eos_id = tuple(eos_id)
    padding = _padding(decoder, pad_id)
    if strategy == "beam" and padding not in (None, PAD_ID):
        raise ValueError(
            f"Argument `pad_id` must be {PAD_ID} with strategy=\"beam\" (finished hypotheses "
            f"are extended with {PAD_ID}). Received: pad_id={padding}")
    vocab_size = checks.vocabulary_size(decoder)
    suppressed_ids = _suppressed(suppressed_ids, padding, vocab_size)
    checks.end_token(eos_id, vocab_size, suppressed_ids)
    eos_id = (None if eos_id is None else tuple(int(e) for e in eos_id)
              if isinstance(eos_id, tuple) else int(eos_id))
    pad_id = _filler(padding, strategy, eos_id)
    prompt_ids = checks.token_ids(
        "prompt_ids", prompt_ids, vocab_size,
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
            f"prompt). Received: max_length={max_length}"
        )
    if strategy == "beam" and max_new_tokens is not None:
        raise ValueError(
            "Argument `max_new_tokens` is not supported with strategy=\"beam\" (a hypothesis is "
            "ranked over its whole length): set `max_length` instead. Received: "
            f"max_new_tokens={max_new_tokens!r}"
        )
    settings = checks.settings(
        caps={"max_new_tokens": max_length},
        max_new_tokens=max_length if max_new_tokens is None else max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    params = tuple(settings.values()) + (ops.convert_to_tensor(float(length_penalty)),)
    outputs = compiled.run(
        _generate, model, (prompt_ids, prompt_lengths) + params,
        {"strategy": strategy, "max_length": max_length, "eos_id": eos_id,
         "beam_size": beam_size, "return_attention": bool(return_attention),
         "return_scores": bool(return_scores), "pad_id": pad_id,
         "suppressed_ids": suppressed_ids}, jit_compile)
    outputs = tuple(outputs)
    return outputs[0] if len(outputs) == 1 else outputs
