"""Mask-Predict: parallel decoding of a conditional masked language model.

Ghazvininejad et al., 2019, "Mask-Predict: Parallel Decoding of Conditional Masked Language
Models", https://arxiv.org/abs/1904.09324, section 3:

1. predict the target length `N` (the `length_beam` most likely lengths of `1..max_length`);
2. iteration 1: every one of the `N` positions is `<mask>`; one parallel decoder pass gives
   each position its most likely token and that token's probability;
3. then for `t = 1..T-1`: re-mask the `n = N (T - t) / T` (rounded down) tokens of lowest
   probability, predict them again in one pass, and keep the new tokens and probabilities at
   those positions only (`T` decoder passes in all);
4. score a candidate by the mean log-probability of its `N` tokens; with `length_beam > 1`,
   keep the best-scoring length per source.

The model follows the contract of `keras_attn.models.nat_seq2seq`: layers `"encoder"`,
`"decoder"` (called as `decoder(ids, encoder_outputs, encoder_padding_mask=...)` with a
`mask_id` property) and `"length_predictor"` (called as `length_predictor(encoder_outputs,
source_mask)`, with a `max_target_length` attribute). The `T` iterations are a
`keras.ops.fori_loop` with static shapes, compiled once per model and settings
(`keras_attn.decoding.compiled`).
"""

from __future__ import annotations

from keras import ops

from keras_attn._checks import check_bool, check_int
from keras_attn.decoding import checks, compiled
from keras_attn.tokens import EOS_ID, PAD_ID

_KIND = ("a keras_attn.models.nat_seq2seq model with layers named 'encoder', 'decoder' and "
         "'length_predictor'")


def _parts(model):
    encoder = compiled.contract_layer(model, "encoder", _KIND, methods=())
    decoder = compiled.contract_layer(model, "decoder", _KIND, methods=())
    length_predictor = compiled.contract_layer(model, "length_predictor", _KIND, methods=())
    if not hasattr(decoder, "mask_id") or not hasattr(length_predictor, "max_target_length"):
        raise ValueError(f"Argument `model` must be {_KIND}. Received: model={model!r}")
    return encoder, decoder, length_predictor


def _predict(decoder, ids, encoder_outputs, source_mask):
    """One parallel pass: the most likely token `(B, T)` and its log-probability `(B, T)`."""
    logits = decoder(ids, encoder_outputs, encoder_padding_mask=source_mask,
                     training=False)  # (B, T, V) float32
    log_probs = ops.log_softmax(logits, axis=-1)
    return (ops.cast(ops.argmax(log_probs, axis=-1), "int32"),
            ops.max(log_probs, axis=-1))


def _mask_predict(model, source_ids, *, iterations: int, length_beam: int, max_length: int,
                  return_lengths: bool):
    encoder, decoder, length_predictor = _parts(model)
    source_ids = ops.cast(source_ids, "int32")
    batch = ops.shape(source_ids)[0]
    source_mask = ops.not_equal(source_ids, PAD_ID)  # (B, S)
    encoder_outputs = encoder(source_ids, training=False)  # (B, S, d)

    # 1. The `length_beam` most likely lengths among 1..max_length.
    length_logits = length_predictor(encoder_outputs, source_mask)  # (B, M + 1)
    classes = ops.arange(ops.shape(length_logits)[-1], dtype="int32")
    allowed = ops.logical_and(classes >= 1, classes <= max_length)
    length_logits = ops.where(allowed, ops.cast(length_logits, "float32"), -1e30)
    _, lengths = ops.top_k(length_logits, k=length_beam)  # (B, l)
    lengths = ops.reshape(ops.cast(lengths, "int32"), (-1,))  # (B l,), source-major

    # Every source repeated `length_beam` times: one candidate per (source, length).
    encoder_outputs = ops.repeat(encoder_outputs, length_beam, axis=0)  # (B l, S, d)
    source_mask = ops.repeat(source_mask, length_beam, axis=0)  # (B l, S)
    positions = ops.arange(max_length, dtype="int32")[None, :]  # (1, T)
    valid = positions < lengths[:, None]  # (B l, T): the N target positions
    mask_token = ops.full_like(lengths[:, None], decoder.mask_id)  # (B l, 1)
    pad = ops.zeros_like(positions)

    # 2. Iteration 1: all N positions masked.
    ids = ops.where(valid, mask_token, pad)  # (B l, T)
    tokens, log_probs = _predict(decoder, ids, encoder_outputs, source_mask)
    tokens = ops.where(valid, tokens, pad)
    log_probs = ops.where(valid, log_probs, 0.0)

    # 3. Iterations 2..T: re-mask the n lowest-probability tokens and predict them again.
    def body(t, carry):
        tokens, log_probs = carry
        count = (lengths * (iterations - t)) // iterations  # (B l,): n = N (T - t) / T
        key = ops.where(valid, log_probs, float("inf"))  # padding ranks last
        rank = ops.argsort(ops.argsort(key, axis=-1), axis=-1)  # (B l, T): 0 = least sure
        remask = rank < count[:, None]  # (B l, T)
        new_tokens, new_log_probs = _predict(decoder, ops.where(remask, mask_token, tokens),
                                             encoder_outputs, source_mask)
        return (ops.where(remask, new_tokens, tokens),
                ops.where(remask, new_log_probs, log_probs))

    if iterations > 1:
        tokens, log_probs = ops.fori_loop(1, iterations, body, (tokens, log_probs))

    # 4. Mean log-probability per candidate; the best length per source.
    scores = ops.sum(log_probs, axis=-1) / ops.cast(lengths, "float32")  # (B l,)
    scores = ops.reshape(scores, (batch, length_beam))
    best = ops.argmax(scores, axis=-1)[:, None]  # (B, 1)
    scores = ops.take_along_axis(scores, best, axis=-1)[:, 0]  # (B,)
    tokens = ops.reshape(tokens, (batch, length_beam, max_length))
    tokens = ops.take_along_axis(tokens, best[:, :, None], axis=1)[:, 0]  # (B, T)
    lengths = ops.take_along_axis(ops.reshape(lengths, (batch, length_beam)), best,
                                  axis=-1)[:, 0]  # (B,)
    # `<eos>` right after the N tokens when it fits, the convention of the other searches.
    tokens = ops.where(positions == lengths[:, None], EOS_ID, tokens)
    outputs = (tokens, scores)
    return outputs + ((lengths,) if return_lengths else ())


def check_mask_predict_args(model, iterations, length_beam, max_length) -> int:
    """Raise a ValueError naming the bad argument of `mask_predict`.

    Args:
        model: a `keras_attn.models.nat_seq2seq` model.
        iterations: int >= 1, Mask-Predict rounds.
        length_beam: int in `[1, max_length]`, candidate lengths per source.
        max_length: int in `[1, model max_target_length]`, or `None` for the model's.

    Returns:
        int, `max_length` (the model's `max_target_length` when `None`).
    """
    _, _, length_predictor = _parts(model)
    check_int("iterations", iterations, 1)
    model_max = int(length_predictor.max_target_length)
    if max_length is None:
        max_length = model_max
    check_int("max_length", max_length, 1)
    if max_length > model_max:
        raise ValueError(
            "Received an invalid value for argument `max_length`, expected at most the model's "
            f"max_target_length={model_max}. Received: max_length={max_length}")
    check_int("length_beam", length_beam, 1)
    if length_beam > max_length:
        raise ValueError(
            "Received an invalid value for argument `length_beam`, expected at most "
            f"max_length={max_length}. Received: length_beam={length_beam}")
    return int(max_length)


def mask_predict(model, source_ids, iterations: int = 10, length_beam: int = 1,
                 max_length: int | None = None, return_lengths: bool = False,
                 jit_compile: bool = False):
    """Translate with Mask-Predict (see the module docstring) in one compiled program.

    Args:
        model: a `keras_attn.models.nat_seq2seq` model.
        source_ids: int `(B, S)` source ids, 0 = padding, each below the encoder's vocabulary
            size (others are refused, `keras_attn.decoding.checks`).
        iterations: int >= 1, decoder passes `T` (1 = a single parallel pass). Defaults
            to `10`.
        length_beam: int in `[1, max_length]`, candidate lengths decoded per source, the best
            mean log-probability wins. Defaults to `1`.
        max_length: int, the longest output, at most the model's `max_target_length`.
            Defaults to `None` (the model's `max_target_length`).
        return_lengths: bool, also return the chosen lengths. Defaults to `False`.
        jit_compile: bool, compile with XLA under TensorFlow. Defaults to `False`.

    Returns:
        `(token_ids, scores)`: int32 `(B, max_length)`, the `N` predicted tokens (never
        padding, `<bos>`, `<eos>` or `<mask>`), then `<eos>` when `N < max_length`, then
        padding (what `TranslationData.decode` reads); float32 `(B,)`, the mean
        log-probability of the `N` tokens (at most 0). With `return_lengths=True` also the
        int32 lengths `N` `(B,)`.

    Example:
    >>> ids, scores = mask_predict(model, data.encode_source(["march 3rd, 2021"]), 4)
    >>> data.decode(ids)  # ['2021-03-03']

    References:
        Ghazvininejad et al., 2019, "Mask-Predict", https://arxiv.org/abs/1904.09324
    """
    max_length = check_mask_predict_args(model, iterations, length_beam, max_length)
    check_bool("return_lengths", return_lengths)
    encoder, _, _ = _parts(model)
    source_ids = checks.token_ids("source_ids", source_ids, checks.vocabulary_size(encoder))
    options = {"iterations": int(iterations), "length_beam": int(length_beam),
               "max_length": int(max_length), "return_lengths": return_lengths}
    return compiled.run(_mask_predict, model, (source_ids,), options, jit_compile)
