"""Greedy search, beam search and sampling for keras_attn sequence-to-sequence models.

The searches decode a model with a layer named `"encoder"`, called as
`encoder_outputs = encoder(source_ids)`, and a layer named `"decoder"` that keeps the decoding
contract of `keras_attn.decoding.contract.Decoder` (every `keras_attn.models` seq2seq builder's
does).

Each search runs the whole batch in one loop (`keras_attn.decoding.loops`), compiled once per
model and settings (`keras_attn.decoding.compiled`). Padding and `<bos>` are never emitted.
"""

from __future__ import annotations

from keras import ops

from keras_attn._checks import check_int, check_number
from keras_attn.decoding import checks, choices, compiled, contract, loops
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID


def _decoder_parts(model):
    """The `"encoder"` and `"decoder"` layers of `model`, checked against the contract."""
    kind = "a keras_attn seq2seq model with layers named 'encoder' and 'decoder'"
    return (compiled.contract_layer(model, "encoder", kind, methods=()),
            compiled.contract_layer(model, "decoder", kind))


def _decode(model, source_ids, *params, strategy, max_length, bos_id, eos_id, beam_size,
            return_attention, return_scores):
    """The whole search for one batch: encode, then decode `max_length` tokens."""
    encoder, decoder = _decoder_parts(model)
    source_ids = ops.cast(source_ids, "int32")
    batch = ops.shape(source_ids)[0]
    state = decoder.init_decode_state(encoder(source_ids), source_ids, max_length)
    tokens = ops.concatenate([ops.full((batch, 1), bos_id, "int32"),
                              ops.zeros((batch, max_length), "int32")], axis=1)  # (B, L + 1)
    prompt_lengths = ops.ones((batch,), "int32")
    # Padding and <bos> are never outputs: an untrained model may rank them first, and
    # padding mid-sequence would read as the end of the output.
    banned = (PAD_ID, bos_id)
    step = contract.step_function(decoder, return_attention)
    if strategy == "beam":
        alpha = params[0]
        tokens, scores, attention = loops.beam_loop(
            step, state, tokens, prompt_lengths, eos_id, banned, beam_size, alpha,
            return_attention)
    else:
        if strategy == "greedy":
            (alpha,) = params

            def choose(logits, index):
                return choices.greedy(logits)
        else:
            temperature, top_k, top_p, seed, alpha = params

            def choose(logits, index):
                filtered = choices.filter_logits(logits, ops.maximum(temperature, 1e-6),
                                                 top_k, top_p)
                sampled = choices.sample(filtered, seed, index)
                return ops.where(temperature > 0, sampled, choices.greedy(logits))
        tokens, scores, attention = loops.token_loop(
            step, state, tokens, prompt_lengths, eos_id, banned, choose, return_attention,
            alpha, return_scores)
    outputs = (tokens[:, 1:],)
    if return_attention:
        outputs += (ops.cast(attention, "float32"),)
    return outputs + ((scores,) if return_scores else ())


def _search(model, source_ids, max_length, strategy, params, bos_id, eos_id, beam_size,
            return_attention, return_scores, jit_compile):
    checks.length("max_length", max_length, 1)
    check_int("bos_id", bos_id, 0)
    encoder, decoder = _decoder_parts(model)
    checks.end_token(eos_id, checks.vocabulary_size(decoder), (PAD_ID, bos_id))
    source_ids = checks.token_ids("source_ids", source_ids, checks.vocabulary_size(encoder))
    outputs = compiled.run(
        _decode, model, (source_ids,) + params,
        {"strategy": strategy, "max_length": int(max_length), "bos_id": int(bos_id),
         "eos_id": None if eos_id is None else int(eos_id), "beam_size": int(beam_size),
         "return_attention": bool(return_attention), "return_scores": bool(return_scores)},
        jit_compile)
    outputs = tuple(outputs)
    return outputs[0] if len(outputs) == 1 else outputs


def greedy_search(
    model,
    source_ids,
    max_length: int,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    return_attention: bool = False,
    jit_compile: bool = False,
    return_scores: bool = False,
    length_penalty: float = 0.6,
):
    """Greedy decoding: at each step the most likely next token, for the whole batch.

    Args:
        model: a keras_attn seq2seq model (layers `"encoder"` and `"decoder"` keeping the
            decoding contract of this module).
        source_ids: integer `(B, S)` source token ids, 0 = padding, each below the encoder's
            vocabulary size.
        max_length: int, number of output positions (the decoder caches hold as many), at
            most `2**31 - 2`.
        bos_id: int, the start token fed first. Defaults to `keras_attn.tokens.BOS_ID` (2).
        eos_id: int, the end token: a token the model can emit (below its vocabulary size,
            not padding or `bos_id`); `None`: no end token, every sequence runs to
            `max_length`. Defaults to `keras_attn.tokens.EOS_ID` (3).
        return_attention: bool, also return every step's cross-attention weights.
            Defaults to `False`.
        jit_compile: bool, compile with XLA (TensorFlow). Defaults to `False`.
        return_scores: bool, also return each sequence's score: its log-probability divided
            by GNMT's `((5 + |Y|) / 6) ** length_penalty`, as beam search ranks. Defaults to
            `False`.
        length_penalty: float >= 0, the exponent of the scores. Defaults to `0.6`.

    Returns:
        int32 token ids `(B, max_length)`, `<bos>` excluded, `<eos>` included, 0 after it; with
        `return_attention=True` also float32 weights `(B, max_length, ..., S)` (for the
        Transformer `(B, max_length, num_layers, num_heads, S)`), zero after `<eos>`; with
        `return_scores=True` also float32 scores `(B,)`.

    Example:
    >>> model = keras_attn.models.transformer_seq2seq(20, 20, num_layers=1, hidden_dim=16)
    >>> tokens = greedy_search(model, [[5, 6, 7, 0]], max_length=10)  # (1, 10)
    """
    check_number("length_penalty", length_penalty, 0)
    return _search(model, source_ids, max_length, "greedy",
                   (ops.convert_to_tensor(float(length_penalty)),), bos_id, eos_id, 1,
                   return_attention, return_scores, jit_compile)


def beam_search(
    model,
    source_ids,
    max_length: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    return_attention: bool = False,
    jit_compile: bool = False,
    return_scores: bool = False,
):
    """Beam search with GNMT length normalization, for the whole batch.

    Each sequence keeps `beam_size` hypotheses (see `keras_attn.decoding.loops.beam_loop`);
    `beam_size=1` is greedy search.

    Args:
        model: a keras_attn seq2seq model (see `greedy_search`).
        source_ids: integer `(B, S)` source token ids, 0 = padding.
        max_length: int, number of output positions.
        beam_size: int, hypotheses kept per sequence. Defaults to `4`.
        length_penalty: float >= 0, the GNMT exponent alpha; 0 ranks by raw log-probability.
            Defaults to `0.6`.
        bos_id: int, the start token. Defaults to `keras_attn.tokens.BOS_ID` (2).
        eos_id: int or None, the end token (see `greedy_search`). Defaults to
            `keras_attn.tokens.EOS_ID` (3).
        return_attention: bool, also return the best hypothesis' cross-attention weights.
            Defaults to `False`.
        jit_compile: bool, compile with XLA (TensorFlow). Defaults to `False`.
        return_scores: bool, also return the best hypothesis' normalized score `(B,)`.
            Defaults to `False`.

    Returns:
        The best hypothesis per sequence as int32 token ids `(B, max_length)` (as
        `greedy_search`); with `return_attention=True` also its weights; with
        `return_scores=True` also its score.

    Example:
    >>> tokens = beam_search(model, [[5, 6, 7, 0]], max_length=10, beam_size=4)  # (1, 10)

    References:
        Wu et al., 2016, "Google's Neural Machine Translation System",
        https://arxiv.org/abs/1609.08144
    """
    check_int("beam_size", beam_size, 1)
    check_number("length_penalty", length_penalty, 0)
    return _search(model, source_ids, max_length, "beam",
                   (ops.convert_to_tensor(float(length_penalty)),), bos_id, eos_id, beam_size,
                   return_attention, return_scores, jit_compile)


def sample(
    model,
    source_ids,
    max_length: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    bos_id: int = BOS_ID,
    eos_id: int | None = EOS_ID,
    return_attention: bool = False,
    jit_compile: bool = False,
    return_scores: bool = False,
    length_penalty: float = 0.6,
):
    """Sampling: each next token drawn from the model's filtered distribution.

    Args:
        model, source_ids, max_length, bos_id, eos_id, return_attention, jit_compile,
            return_scores, length_penalty: as `greedy_search`.
        temperature: float >= 0: logits are divided by it; 0 is greedy search.
            Defaults to `1.0`.
        top_k: int >= 0, draw among the `top_k` most likely tokens only; 0 = all.
            Defaults to `0`.
        top_p: float in (0, 1], draw among the smallest set of most likely tokens whose
            probability reaches `top_p` (nucleus sampling); 1 = all. Defaults to `1.0`.
        seed: int in [0, 2**31 - 1]: the same seed gives the same tokens. Defaults to `0`.

    Each of `temperature`, `top_k`, `top_p` and `seed` may be a Python number or a scalar
    tensor (e.g. a SavedModel input). A value out of range (NaN, negative, a float `top_k`)
    is refused, never replaced: a ValueError naming it when the value is known at the call,
    else the call fails with the same message when the graph runs
    (`keras_attn.decoding.checks`).

    Returns:
        As `greedy_search`.

    References:
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration",
        https://arxiv.org/abs/1904.09751
    """
    check_number("length_penalty", length_penalty, 0)
    settings = checks.settings(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    params = tuple(settings.values()) + (ops.convert_to_tensor(float(length_penalty)),)
    return _search(model, source_ids, max_length, "sample", params, bos_id, eos_id, 1,
                   return_attention, return_scores, jit_compile)
