"""The decoding loops, on `keras.ops` (`while_loop`, `take_along_axis`, `top_k`): one token per
step over a static-shape cache, the whole batch at once, stopping when every sequence is done.

Both loops know no model. They drive a `step(token_ids, index, state)` function returning
`(logits, state, attention)` (`keras_attn.decoding.contract.Decoder.decode_step`): `token_ids`
int32 `(N,)` is the token at position `index` (a scalar int32 tensor), `logits` float32
`(N, V)` predict position `index + 1`, `attention` is that step's attention `(N, ...)`, read
only with `return_attention_scores=True` (it may be None otherwise). Sequences are `(B, L)`
token buffers: each row's first `prompt_lengths[b]` tokens are given (forced), the rest is
chosen (by a sampler, `keras_attn.decoding.samplers`). A token chosen after a row emitted one of
`stop_token_ids` is padding; with `stop_token_ids=None` no token ends a row. A stop id the
model cannot emit (outside its logits, or one of the tokens never emitted) is refused with a
ValueError when the loop is built.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn.decoding import checks, choices, stepwise
from keras_attn.tokens import PAD_ID

NEG = choices.NEG


def write(buffer, index, values):
    """`buffer[:, index] = values` for a `(B, L, ...)` buffer and `(B, ...)` values."""
    length = ops.shape(buffer)[1]
    at_index = ops.equal(ops.arange(length, dtype="int32"), index)  # (L,)
    at_index = ops.reshape(at_index, (1, -1) + (1,) * (len(buffer.shape) - 2))
    return ops.where(at_index, ops.expand_dims(values, 1), buffer)


def column(buffer, index):
    """`buffer[:, index]`."""
    return ops.take(buffer, index, axis=1)


def _zero_rows(done, values):
    """Zero the rows of `values` (batch on axis 0) where the boolean `done` `(B,)` is True."""
    done = ops.reshape(done, (-1,) + (1,) * (len(values.shape) - 1))
    return ops.where(done, ops.zeros_like(values), values)


def _ends(token, stop_token_ids):
    """Boolean: `token` is one of the tuple `stop_token_ids` (never, with None)."""
    ends = ops.zeros_like(token, "bool")
    for end in stop_token_ids or ():
        ends = ops.logical_or(ends, ops.equal(token, end))
    return ends


def _check_end_token(logits, stop_token_ids, never_emitted) -> None:
    """The ValueError of `checks.stop_tokens`, with the vocabulary read from the logits'
    static shape (when it is known)."""
    vocab_size = logits.shape[-1]
    checks.stop_tokens(stop_token_ids, vocab_size if isinstance(vocab_size, int) else None,
                       never_emitted)


def _masked_logits(logits, never_emitted: tuple):
    """float32 logits with the tokens `never_emitted` (ids) at `NEG`."""
    logits = ops.cast(logits, "float32")
    ids = ops.arange(ops.shape(logits)[-1], dtype="int32")
    for banned in never_emitted:
        logits = ops.where(ops.equal(ids, banned), NEG, logits)
    return logits


def length_penalty(lengths, alpha):
    """GNMT's length normalizer `((5 + |Y|) / 6) ** alpha` (Wu et al., 2016)."""
    return ops.power((5.0 + ops.cast(lengths, "float32")) / 6.0, ops.cast(alpha, "float32"))


def token_loop(step, state, tokens, prompt_lengths, stop_token_ids: tuple | None,
               never_emitted, choose, return_attention_scores: bool = False, alpha=0.0,
               return_scores: bool = True, limits=None, pad_id: int = PAD_ID):
    """One token at a time: at each step `choose(logits, tokens, index)` picks the next token
    (a sampler's `get_next_token`).

    Args:
        step: the step function (module docstring).
        state: the decoding state after the prompt's positions before `min(prompt_lengths) - 1`.
        tokens: int32 `(B, L)`: the prompts, then anything.
        prompt_lengths: int32 `(B,)`, each at least 1.
        stop_token_ids: a tuple of the ids that end a row, or None (none).
        never_emitted: tuple of token ids never chosen (padding, `<bos>`).
        choose: `(logits float32 (B, V), tokens int32 (B, L), index) -> int32 (B,)`: the
            logits with the ids never emitted at `NEG`; `tokens[:, :index + 1]` the sequences
            so far.
        return_attention_scores: bool, also return every step's attention
            `(B, L - 1, ...)`.
        alpha: length-penalty exponent of the returned scores.
        return_scores: bool, compute the scores (a log-softmax per step). Defaults to `True`.
        limits: optional int32 `(B,)`: row `b` ends (padding after) at position `limits[b]`,
            e.g. its prompt length plus a number of new tokens. Defaults to `None` (the
            buffer's end).
        pad_id: int, the token written after a row ends. Defaults to `PAD_ID` (0).

    Returns:
        `(tokens, scores, attention)`: the filled `(B, L)` buffer; float32 `(B,)` log-probability
        of the chosen tokens (under the model, before any filtering), divided by
        `length_penalty(count, alpha)`, or None; the attention or None.
    """
    batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    start = ops.min(prompt_lengths) - 1

    def advance(index, tokens, finished, log_prob, count, state):
        logits, state, attention = step(column(tokens, index), index, state)
        _check_end_token(logits, stop_token_ids, never_emitted)
        logits = ops.cast(logits, "float32")  # (B, V)
        chosen = choose(_masked_logits(logits, never_emitted), tokens, index)  # (B,)
        forced = index + 1 < prompt_lengths  # (B,): still inside the prompt
        if limits is not None:  # past its limit a row is done
            finished = ops.logical_or(finished, ops.logical_and(
                ops.logical_not(forced), index + 1 >= limits))
        token = ops.where(forced, column(tokens, index + 1),
                          ops.where(finished, pad_id, chosen))
        live = ops.logical_not(ops.logical_or(forced, finished))
        if return_scores:
            step_log_prob = ops.take_along_axis(ops.log_softmax(logits, axis=-1),
                                                ops.expand_dims(chosen, -1), axis=-1)[:, 0]
            log_prob = log_prob + ops.where(live, step_log_prob, 0.0)
            count = count + ops.cast(live, "int32")
        if return_attention_scores:
            attention = _zero_rows(ops.logical_not(live), ops.convert_to_tensor(attention))
        finished = ops.logical_or(finished, ops.logical_and(live, _ends(token, stop_token_ids)))
        return write(tokens, index + 1, token), finished, log_prob, count, state, attention

    finished = ops.zeros((batch,), "bool")
    log_prob = ops.zeros((batch,), "float32")
    count = ops.zeros((batch,), "int32")
    # The first step runs outside the loop: it fixes the attention's shape and dtype.
    tokens, finished, log_prob, count, state, attention = advance(
        start, tokens, finished, log_prob, count, state)
    history = ops.zeros((0,), "float32")  # carried through the loop only when asked for
    if return_attention_scores:
        history = ops.zeros((batch, length - 1) + tuple(ops.shape(attention)[1:]),
                            attention.dtype)
        history = write(history, start, attention)

    def cond(index, tokens, finished, log_prob, count, state, history):
        return ops.logical_and(index < length - 1, ops.logical_not(ops.all(finished)))

    def body(index, tokens, finished, log_prob, count, state, history):
        tokens, finished, log_prob, count, state, attention = advance(
            index, tokens, finished, log_prob, count, state)
        if return_attention_scores:
            history = write(history, index, attention)
        return index + 1, tokens, finished, log_prob, count, state, history

    _, tokens, _, log_prob, count, _, history = stepwise.while_loop(
        cond, body, (start + 1, tokens, finished, log_prob, count, state, history))
    scores = log_prob / length_penalty(count, alpha) if return_scores else None
    return tokens, scores, history if return_attention_scores else None


def beam_loop(step, state, tokens, prompt_lengths, stop_token_ids: tuple | None, never_emitted,
              beam_size: int, alpha, return_attention_scores: bool = False, process=None,
              pad_id: int = PAD_ID):
    """Beam search with GNMT length normalization over a `(B, L)` prompt buffer.

    Each sequence keeps `beam_size` hypotheses. A live hypothesis is expanded by every token; a
    finished one (it emitted a stop id) stays as it is; inside a prompt the only candidate is the
    prompt's token. The best `beam_size` candidates by `log P(Y) / ((5 + |Y|) / 6) ** alpha`
    survive, `|Y|` counting the chosen tokens and `<eos>`. The search stops when no live
    hypothesis can overtake the best finished one (log-probabilities only fall as a hypothesis
    grows, and the penalty is largest at the full length), or at the end of the buffer.

    Args:
        step: the step function (module docstring), run on `B · beam_size` rows.
        state: the decoding state, batch `B` (repeated for the beams here).
        tokens, prompt_lengths, stop_token_ids, never_emitted, return_attention_scores: as
            `token_loop`.
        beam_size: int, hypotheses per sequence.
        alpha: float or scalar tensor >= 0, the length-penalty exponent.
        process: optional `(log_probs float32 (B · K, V), tokens int32 (B · K, L), index) ->
            float32 (B · K, V)`, applied to each step's log-probabilities (a repetition
            penalty, `Sampler.process_logits`). Defaults to `None`.
        pad_id: int, the token that follows a hypothesis' end. Defaults to `PAD_ID` (0).

    Returns:
        `(tokens, scores, attention)` of the best hypothesis of each sequence, as `token_loop`.
    """
    batch, length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    start = ops.min(prompt_lengths) - 1
    # (B, ...) -> (B · K, ...): beam k of sequence b at row b · K + k.
    state = keras.tree.map_structure(lambda x: ops.repeat(x, beam_size, axis=0), state)
    offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * beam_size, 1)  # (B, 1)
    best_possible = length_penalty(length - 1, alpha)

    def advance(index, sequences, log_probs, lengths, finished, state):
        """Expand every beam by one token and keep the best `beam_size` candidates."""
        flat_tokens = ops.reshape(ops.take(sequences, index, axis=2), (-1,))  # (B · K,)
        logits, state, attention = step(flat_tokens, index, state)
        _check_end_token(logits, stop_token_ids, never_emitted)
        vocab = ops.shape(logits)[-1]
        # Log-probabilities under the model (every token), then the banned ones ruled out.
        step_log_probs = _masked_logits(ops.log_softmax(ops.cast(logits, "float32"), axis=-1),
                                        never_emitted)
        if process is not None:
            step_log_probs = process(step_log_probs, ops.reshape(
                sequences, (batch * beam_size, length)), index)
        step_log_probs = ops.reshape(step_log_probs, (batch, beam_size, vocab))  # (B, K, V)
        ids = ops.arange(vocab, dtype="int32")
        forced = ops.reshape(index + 1 < prompt_lengths, (-1, 1, 1))  # (B, 1, 1)
        prompt_token = column(sequences[:, 0], index + 1)[:, None, None]  # (B, 1, 1)
        step_log_probs = ops.where(forced, ops.where(ids == prompt_token, 0.0, NEG),
                                   step_log_probs)
        live = ops.expand_dims(log_probs, -1) + step_log_probs  # (B, K, V)
        kept = ops.where(ids == pad_id, ops.expand_dims(log_probs, -1), NEG)  # finished beams
        candidates = ops.where(ops.expand_dims(finished, -1), kept, live)  # (B, K, V)
        grown = lengths + ops.where(forced[..., 0], 0, 1)  # (B, K)
        candidate_lengths = ops.where(finished, lengths, grown)  # (B, K)
        normalized = candidates / ops.expand_dims(length_penalty(candidate_lengths, alpha), -1)
        _, top = ops.top_k(ops.reshape(normalized, (batch, -1)), beam_size)  # (B, K), best first
        top = ops.cast(top, "int32")
        parent, token = top // vocab, top % vocab  # (B, K)
        log_probs = ops.take_along_axis(ops.reshape(candidates, (batch, -1)), top, axis=1)
        lengths = ops.take_along_axis(candidate_lengths, parent, axis=1)
        parent_finished = ops.take_along_axis(finished, parent, axis=1)
        finished = ops.logical_or(parent_finished, ops.logical_and(
            ops.logical_not(forced[..., 0]), _ends(token, stop_token_ids)))
        rows = ops.reshape(offsets + parent, (-1,))  # (B · K,)
        state = keras.tree.map_structure(lambda x: ops.take(x, rows, axis=0), state)
        if return_attention_scores:
            attention = ops.take(ops.convert_to_tensor(attention), rows, axis=0)
            attention = _zero_rows(ops.reshape(ops.logical_or(parent_finished, forced[..., 0]),
                                               (-1,)), attention)
        sequences = _gather_beams(sequences, parent)  # (B, K, L) by parent beam
        sequences = ops.reshape(write(ops.reshape(sequences, (batch * beam_size, length)),
                                      index + 1, ops.reshape(token, (-1,))),
                                (batch, beam_size, length))
        return sequences, log_probs, lengths, finished, parent, state, attention

    # Every beam starts as the prompt; only beam 0 is live, so the first expansion does not
    # return K copies of one candidate.
    sequences = ops.repeat(ops.expand_dims(tokens, 1), beam_size, axis=1)  # (B, K, L)
    first_beam = ops.equal(ops.arange(beam_size), 0)
    log_probs = ops.where(first_beam, 0.0, NEG) * ops.ones((batch, 1))  # (B, K)
    lengths = ops.zeros((batch, beam_size), "int32")
    finished = ops.zeros((batch, beam_size), "bool")
    sequences, log_probs, lengths, finished, _, state, attention = advance(
        start, sequences, log_probs, lengths, finished, state)
    history = ops.zeros((0,), "float32")
    if return_attention_scores:
        shape = (batch, beam_size, length - 1) + tuple(ops.shape(attention)[1:])
        history = ops.zeros(shape, attention.dtype)
        history = _write_beams(history, start, attention)

    def done(log_probs, lengths, finished):
        scores = log_probs / length_penalty(lengths, alpha)  # (B, K)
        best_finished = ops.max(ops.where(finished, scores, 2 * NEG), axis=1)  # (B,)
        bound = ops.max(ops.where(finished, 2 * NEG, log_probs / best_possible), axis=1)
        return ops.all(bound <= best_finished)

    def cond(index, sequences, log_probs, lengths, finished, state, history):
        return ops.logical_and(index < length - 1,
                               ops.logical_not(done(log_probs, lengths, finished)))

    def body(index, sequences, log_probs, lengths, finished, state, history):
        sequences, log_probs, lengths, finished, parent, state, attention = advance(
            index, sequences, log_probs, lengths, finished, state)
        if return_attention_scores:
            history = _write_beams(_gather_beams(history, parent), index, attention)
        return index + 1, sequences, log_probs, lengths, finished, state, history

    outputs = stepwise.while_loop(cond, body, (start + 1, sequences, log_probs, lengths, finished,
                                          state, history))
    _, sequences, log_probs, lengths, _, _, history = outputs
    # Candidates stay sorted by normalized score: beam 0 is the best.
    scores = log_probs[:, 0] / length_penalty(lengths[:, 0], alpha)
    return sequences[:, 0], scores, history[:, 0] if return_attention_scores else None


def _gather_beams(x, parent):
    """`x[b, parent[b, k]]` for `x` `(B, K, ...)` and int `parent` `(B, K)`."""
    indices = ops.reshape(parent, tuple(ops.shape(parent)) + (1,) * (len(x.shape) - 2))
    return ops.take_along_axis(x, ops.broadcast_to(indices, ops.shape(x)), axis=1)


def _write_beams(history, index, attention):
    """`history[:, :, index] = attention` for `(B, K, L, ...)` and `(B · K, ...)`."""
    batch, beams = ops.shape(history)[0], ops.shape(history)[1]
    flat = ops.reshape(history, (batch * beams,) + tuple(ops.shape(history)[2:]))
    return ops.reshape(write(flat, index, attention), ops.shape(history))


def search(step, state, tokens, prompt_lengths, sampler, ids: dict, alpha,
           return_attention_scores: bool = False, return_scores: bool = True, limits=None):
    """The loop `sampler` asks for: `beam_loop` for a `Beam` of more than one beam (its
    wrapper's `process_logits` on the step log-probabilities), else `token_loop` with the
    sampler's `get_next_token`.

    Args:
        step, state, tokens, prompt_lengths, alpha, return_attention_scores, return_scores,
            limits: as `token_loop` (`limits` and `return_scores=False` one token at a time
            only).
        sampler: a `keras_attn.decoding.samplers.Sampler` whose numbers are tensors
            (`Sampler.bind`).
        ids: the special ids (`keras_attn.decoding.special_ids`): `stop_token_ids`,
            `suppressed_ids` (never emitted), `fill_id` (after a row's end).

    Returns:
        `(tokens, scores, attention)` as `token_loop`.
    """
    stops, banned, fill = ids["stop_token_ids"], ids["suppressed_ids"], ids["fill_id"]
    beam = sampler.beam()
    if beam is not None and beam.num_beams > 1:
        process = None if sampler is beam else sampler.process_logits
        return beam_loop(step, state, tokens, prompt_lengths, stops, banned, beam.num_beams,
                         alpha, return_attention_scores, process=process, pad_id=fill)
    return token_loop(step, state, tokens, prompt_lengths, stops, banned,
                      sampler.get_next_token, return_attention_scores, alpha, return_scores,
                      limits, pad_id=fill)
