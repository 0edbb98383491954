"""Greedy and beam search for keras_attn seq2seq models, each one compiled TensorFlow graph.

The search knows no model. It relies on the decoding contract every `keras_attn.models`
seq2seq builder keeps:

- the model has a layer named `"encoder"`, called as `encoder_outputs = encoder(source_ids)`
  (any nested structure of tensors), and a layer named `"decoder"` with two methods:
- `state = decoder.init_decode_state(encoder_outputs, source_ids, max_length)`: a nested
  structure of tensors, each with the batch on axis 0 and a static shape (caches preallocated
  to `max_length`);
- `logits, state, attention = decoder.decode_step(token_ids, index, state)`: `token_ids` int32
  `(B,)` is the token at target position `index` (a scalar int32 tensor, 0 for `<bos>`);
  `logits` float32 `(B, vocab)` predict the next token; `attention` `(B, ..., S)` is this step's
  cross-attention.

Both searches run the whole batch in one `tf.while_loop` that stops as soon as every sequence
is done. Called eagerly, they trace (once per model and settings) a `tf.function` whose input
signature has batch size and source length None; called inside a `tf.function` (e.g. a
SavedModel signature), they add their ops to that graph. Nothing inside depends on Python
values of the batch size or on NumPy.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from keras_attn._checks import check_int

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Score of impossible candidates (beams that do not exist yet, finished beams' other tokens):
# far below any real log-probability, yet finite so no inf - inf can appear.
_NEG = -1e9


def _decoder_parts(model):
    """The `"encoder"` and `"decoder"` layers of `model`, checked against the contract."""
    try:
        encoder = model.get_layer("encoder")
        decoder = model.get_layer("decoder")
    except (AttributeError, ValueError) as error:
        raise ValueError(
            "Argument `model` must be a keras_attn seq2seq model with layers named 'encoder' "
            f"and 'decoder'. Received: model={model!r}"
        ) from error
    for method in ("init_decode_state", "decode_step"):
        if not callable(getattr(decoder, method, None)):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                f"Argument `model` has a 'decoder' layer without a `{method}` method, so it "
                f"cannot be decoded step by step. Received: decoder={decoder!r}"
            )
    return encoder, decoder


def _write(buffer, index, values):
    """`buffer[:, index] = values` for a `(B, L, ...)` buffer and `(B, ...)` values."""
    length = tf.shape(buffer)[1]
    at_index = tf.equal(tf.range(length), index)  # (L,)
    at_index = tf.reshape(at_index, [1, -1] + [1] * (len(buffer.shape) - 2))  # (1, L, 1...)
    return tf.where(at_index, tf.expand_dims(values, 1), buffer)


def _zero_where(done, values):
    """Zero the rows of `values` (batch on axis 0) where the boolean `done` `(B,)` is True."""
    done = tf.reshape(done, [-1] + [1] * (len(values.shape) - 1))  # (B, 1, ...)
    return tf.where(done, tf.zeros_like(values), values)


def _attention_buffer(attention, leading, max_length: int):
    """All-zero `leading + (max_length,) + attention.shape[1:]` buffer for stacked steps."""
    shape = tf.concat([leading, [max_length], tf.shape(attention)[1:]], axis=0)
    return tf.zeros(shape, attention.dtype)


def _never_emitted(vocab_size, bos_id: int):
    """`(V,)` True for padding (id 0) and `<bos>`, which are never outputs: an untrained
    model may rank them first, and a 0 mid-sequence would read as the end of the output."""
    ids = tf.range(vocab_size)
    return tf.logical_or(tf.equal(ids, 0), tf.equal(ids, bos_id))


def _greedy(model, source_ids, max_length, bos_id, eos_id, return_attention):
    encoder, decoder = _decoder_parts(model)
    batch_size = tf.shape(source_ids)[0]
    encoder_outputs = encoder(source_ids)
    state = decoder.init_decode_state(encoder_outputs, source_ids, max_length)

    def step(index, previous, finished, state):
        logits, state, attention = decoder.decode_step(previous, index, state)
        logits = tf.where(_never_emitted(tf.shape(logits)[-1], bos_id), tf.float32.min,
                          tf.cast(logits, tf.float32))  # (B, V)
        tokens = tf.argmax(logits, axis=-1, output_type=tf.int32)  # (B,)
        tokens = tf.where(finished, 0, tokens)  # padding after <eos>
        attention = _zero_where(finished, tf.convert_to_tensor(attention))
        return tokens, tf.logical_or(finished, tf.equal(tokens, eos_id)), state, attention

    # Step 0 runs outside the loop: it fixes the shape and dtype of the attention.
    bos = tf.fill([batch_size], tf.constant(bos_id, tf.int32))
    finished = tf.zeros([batch_size], tf.bool)
    tokens, finished, state, attention = step(tf.constant(0), bos, finished, state)
    output = _write(tf.zeros([batch_size, max_length], tf.int32), 0, tokens)  # (B, L)
    history = tf.zeros([0])  # carried through the loop only when asked for
    if return_attention:
        history = _write(_attention_buffer(attention, [batch_size], max_length), 0, attention)

    def cond(index, previous, finished, state, output, history):
        return tf.logical_and(index < max_length, tf.logical_not(tf.reduce_all(finished)))

    def body(index, previous, finished, state, output, history):
        tokens, finished, state, attention = step(index, previous, finished, state)
        output = _write(output, index, tokens)
        if return_attention:
            history = _write(history, index, attention)
        return index + 1, tokens, finished, state, output, history

    loop_vars = (tf.constant(1), tokens, finished, state, output, history)
    _, _, _, _, output, history = tf.while_loop(cond, body, loop_vars)
    return (output, history) if return_attention else output


def _length_penalty(lengths, alpha: float):
    """GNMT's length normalizer ((5 + |Y|) / 6)^alpha."""
    return tf.pow((5.0 + tf.cast(lengths, tf.float32)) / 6.0, alpha)


def _beam(model, source_ids, max_length, beam_size, length_penalty, bos_id, eos_id,
          return_attention):
    encoder, decoder = _decoder_parts(model)
    batch_size = tf.shape(source_ids)[0]
    encoder_outputs = encoder(source_ids)
    state = decoder.init_decode_state(encoder_outputs, source_ids, max_length)
    # (B, ...) -> (B * K, ...): beam k of sequence b at row b * K + k.
    state = tf.nest.map_structure(lambda x: tf.repeat(x, beam_size, axis=0), state)
    batch_offsets = tf.expand_dims(tf.range(batch_size) * beam_size, 1)  # (B, 1)
    best_possible_penalty = _length_penalty(max_length, length_penalty)

    def step(index, previous, log_probs, lengths, finished, state):
        """Expand every beam by one token and keep the best `beam_size` candidates.

        A live beam's candidates are its `V` continuations, each of length `index + 1`; a
        finished beam has one candidate, itself followed by padding, with its score and
        length unchanged. Candidates are ranked by `log P / length_penalty(length)`.
        """
        logits, state, attention = decoder.decode_step(
            tf.reshape(previous, [-1]), index, state
        )  # (B * K, V), ..., (B * K, ...)
        vocab_size = tf.shape(logits)[-1]
        step_log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        step_log_probs = tf.where(_never_emitted(vocab_size, bos_id), _NEG, step_log_probs)
        step_log_probs = tf.reshape(step_log_probs, [batch_size, beam_size, vocab_size])
        live = tf.expand_dims(log_probs, -1) + step_log_probs  # (B, K, V)
        is_pad = tf.equal(tf.range(vocab_size), 0)  # (V,)
        kept = tf.where(is_pad, tf.expand_dims(log_probs, -1), _NEG)  # (B, K, V)
        candidates = tf.where(tf.expand_dims(finished, -1), kept, live)  # (B, K, V)
        candidate_lengths = tf.where(finished, lengths, index + 1)  # (B, K)
        normalized = candidates / tf.expand_dims(
            _length_penalty(candidate_lengths, length_penalty), -1
        )  # (B, K, V)
        flat = tf.reshape(normalized, [batch_size, beam_size * vocab_size])  # (B, K * V)
        _, top = tf.math.top_k(flat, k=beam_size)  # (B, K), sorted best first
        parent = top // vocab_size  # (B, K)
        tokens = top % vocab_size  # (B, K)
        log_probs = tf.gather(
            tf.reshape(candidates, [batch_size, -1]), top, batch_dims=1
        )  # (B, K)
        lengths = tf.gather(candidate_lengths, parent, batch_dims=1)  # (B, K)
        parent_finished = tf.gather(finished, parent, batch_dims=1)  # (B, K)
        finished = tf.logical_or(parent_finished, tf.equal(tokens, eos_id))
        rows = tf.reshape(batch_offsets + parent, [-1])  # (B * K,)
        state = tf.nest.map_structure(lambda x: tf.gather(x, rows, axis=0), state)
        attention = tf.gather(tf.convert_to_tensor(attention), rows, axis=0)  # (B * K, ...)
        attention = _zero_where(tf.reshape(parent_finished, [-1]), attention)
        return tokens, log_probs, lengths, finished, parent, state, attention

    def reorder(buffer, parent):
        return tf.gather(buffer, parent, batch_dims=1)  # (B, K, ...) by parent beam

    # Step 0 outside the loop. Every beam starts as <bos>; only beam 0 is live, so the first
    # expansion does not return K copies of the same candidate.
    bos = tf.fill([batch_size, beam_size], tf.constant(bos_id, tf.int32))
    first_beam = tf.equal(tf.range(beam_size), 0)  # (K,)
    log_probs = tf.where(first_beam, 0.0, _NEG) * tf.ones([batch_size, 1])  # (B, K)
    lengths = tf.zeros([batch_size, beam_size], tf.int32)
    finished = tf.zeros([batch_size, beam_size], tf.bool)
    tokens, log_probs, lengths, finished, _, state, attention = step(
        tf.constant(0), bos, log_probs, lengths, finished, state
    )
    sequences = tf.zeros([batch_size * beam_size, max_length], tf.int32)
    sequences = _write(sequences, 0, tf.reshape(tokens, [-1]))  # (B * K, L)
    sequences = tf.reshape(sequences, [batch_size, beam_size, max_length])  # (B, K, L)
    history = tf.zeros([0])  # carried through the loop only when asked for
    if return_attention:
        history = _write(_attention_buffer(attention, [batch_size * beam_size], max_length), 0,
                         attention)  # (B * K, L, ...)
        history = tf.reshape(
            history, tf.concat([[batch_size, beam_size], tf.shape(history)[1:]], axis=0)
        )  # (B, K, L, ...)

    def done(log_probs, lengths, finished):
        """True when no live beam can still beat the best finished one of its sequence.

        Log-probabilities only fall as a beam grows and the penalty is largest at
        `max_length`, so `log P / length_penalty(max_length)` bounds a live beam's future
        score; stopping then returns what running to `max_length` would.
        """
        scores = log_probs / _length_penalty(lengths, length_penalty)  # (B, K)
        best_finished = tf.reduce_max(tf.where(finished, scores, 2 * _NEG), axis=1)  # (B,)
        bound = tf.reduce_max(
            tf.where(finished, 2 * _NEG, log_probs / best_possible_penalty), axis=1
        )  # (B,)
        return tf.reduce_all(bound <= best_finished)

    def cond(index, tokens, log_probs, lengths, finished, state, sequences, history):
        return tf.logical_and(
            index < max_length, tf.logical_not(done(log_probs, lengths, finished))
        )

    def body(index, tokens, log_probs, lengths, finished, state, sequences, history):
        tokens, log_probs, lengths, finished, parent, state, attention = step(
            index, tokens, log_probs, lengths, finished, state
        )
        sequences = reorder(sequences, parent)  # (B, K, L)
        sequences = tf.reshape(
            _write(tf.reshape(sequences, [batch_size * beam_size, max_length]), index,
                   tf.reshape(tokens, [-1])),
            [batch_size, beam_size, max_length],
        )
        if return_attention:
            history = reorder(history, parent)  # (B, K, L, ...)
            flat_shape = tf.concat([[batch_size * beam_size], tf.shape(history)[2:]], axis=0)
            history = tf.reshape(
                _write(tf.reshape(history, flat_shape), index, attention), tf.shape(history)
            )
        return index + 1, tokens, log_probs, lengths, finished, state, sequences, history

    loop_vars = (tf.constant(1), tokens, log_probs, lengths, finished, state, sequences,
                 history)
    outputs = tf.while_loop(cond, body, loop_vars)
    sequences, history = outputs[-2], outputs[-1]
    # Candidates are kept sorted by normalized score: beam 0 is the best.
    if return_attention:
        return sequences[:, 0], history[:, 0]
    return sequences[:, 0]


def _run(impl, model, source_ids, jit_compile: bool, **options):
    """Add `impl` to the graph being traced, or call its cached `tf.function` eagerly."""
    source_ids = tf.cast(source_ids, tf.int32)
    if tf.inside_function():
        return impl(model, source_ids, **options)
    key = (impl.__name__, jit_compile, tuple(sorted(options.items())))
    compiled = _COMPILED.setdefault(model, {})
    if key not in compiled:
        model_ref = weakref.ref(model)  # the cache must not keep the model alive

        def search(source_ids):
            return impl(model_ref(), source_ids, **options)

        compiled[key] = tf.function(
            search,
            input_signature=[tf.TensorSpec([None, None], tf.int32, name="source_ids")],
            jit_compile=jit_compile,
        )
    return compiled[key](source_ids)


def greedy_search(
    model,
    source_ids,
    max_length: int,
    bos_id: int = 2,
    eos_id: int = 3,
    return_attention: bool = False,
    jit_compile: bool = False,
):
    """Greedy decoding: at each step the most likely next token, for the whole batch.

    Args:
        model: a keras_attn seq2seq model (layers `"encoder"` and `"decoder"` keeping the
            decoding contract of this module).
        source_ids: integer `(B, S)` source token ids, 0 = padding.
        max_length: int, number of output positions (the decoder caches hold as many).
        bos_id: int, the start token fed first. Defaults to `2`.
        eos_id: int, the end token. Defaults to `3`.
        return_attention: bool, also return every step's cross-attention weights.
            Defaults to `False`.
        jit_compile: bool, compile the eager-mode graph with XLA. Defaults to `False`.

    Returns:
        int32 token ids `(B, max_length)`, `<bos>` excluded, `<eos>` included, 0 after it;
        with `return_attention=True` also float32 weights `(B, max_length, ..., S)` (for the
        Transformer `(B, max_length, num_layers, num_heads, S)`), zero after `<eos>`.

    Example:
    >>> model = keras_attn.models.transformer_seq2seq(20, 20, num_layers=1, embed_dim=16)
    >>> tokens = greedy_search(model, [[5, 6, 7, 0]], max_length=10)  # (1, 10)
    """
    check_int("max_length", max_length, 1)
    check_int("bos_id", bos_id, 0)
    check_int("eos_id", eos_id, 0)
    return _run(
        _greedy, model, source_ids, jit_compile, max_length=max_length, bos_id=bos_id,
        eos_id=eos_id, return_attention=bool(return_attention),
    )


def beam_search(
    model,
    source_ids,
    max_length: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    bos_id: int = 2,
    eos_id: int = 3,
    return_attention: bool = False,
    jit_compile: bool = False,
):
    """Beam search with GNMT length normalization, for the whole batch.

    Each sequence keeps `beam_size` hypotheses. A live hypothesis is expanded by every token;
    a finished one (it emitted `eos_id`) stays as it is. The best `beam_size` candidates by
    `log P(Y) / ((5 + |Y|) / 6)^length_penalty` survive, `|Y|` counting `<eos>`. The search
    stops when no live hypothesis can overtake the best finished one, or at `max_length`.
    `beam_size=1` is greedy search.

    Args:
        model: a keras_attn seq2seq model (see `greedy_search`).
        source_ids: integer `(B, S)` source token ids, 0 = padding.
        max_length: int, number of output positions.
        beam_size: int, hypotheses kept per sequence. Defaults to `4`.
        length_penalty: float >= 0, the GNMT exponent alpha; 0 ranks by raw log-probability.
            Defaults to `0.6`.
        bos_id: int, the start token. Defaults to `2`.
        eos_id: int, the end token. Defaults to `3`.
        return_attention: bool, also return the best hypothesis' cross-attention weights.
            Defaults to `False`.
        jit_compile: bool, compile the eager-mode graph with XLA. Defaults to `False`.

    Returns:
        The best hypothesis per sequence as int32 token ids `(B, max_length)` (as
        `greedy_search`); with `return_attention=True` also its weights
        `(B, max_length, ..., S)`.

    Example:
    >>> tokens = beam_search(model, [[5, 6, 7, 0]], max_length=10, beam_size=4)  # (1, 10)

    References:
        Wu et al., 2016, "Google's Neural Machine Translation System",
        https://arxiv.org/abs/1609.08144
    """
    check_int("max_length", max_length, 1)
    check_int("beam_size", beam_size, 1)
    check_int("bos_id", bos_id, 0)
    check_int("eos_id", eos_id, 0)
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or (
        length_penalty < 0
    ):
        raise ValueError(
            "Received an invalid value for argument `length_penalty`, expected a float >= 0. "
            f"Received: length_penalty={length_penalty!r}"
        )
    return _run(
        _beam, model, source_ids, jit_compile, max_length=max_length, beam_size=beam_size,
        length_penalty=float(length_penalty), bos_id=bos_id, eos_id=eos_id,
        return_attention=bool(return_attention),
    )
