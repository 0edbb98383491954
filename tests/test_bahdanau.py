"""Bahdanau attention seq2seq: GRU encoder, attention decoder, model, decoding."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from backend_utils import as_np, assert_allclose, assert_array_equal, dtype_of

from keras_attn import decoding
from keras_attn.layers import BahdanauCell
from keras_attn.metrics import MaskedAccuracy, MaskedSequenceLoss
from keras_attn.models import BahdanauDecoder, BahdanauEncoder, bahdanau_seq2seq

SOURCE = np.array([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0], [4, 12, 13, 0, 0]], "int32")
TARGET_IN = np.array([[2, 6, 7, 8], [2, 9, 3, 0], [2, 10, 11, 12]], "int32")


def small_model(num_layers=2, **kwargs):
    return bahdanau_seq2seq(16, 14, embedding_dim=6, units=8, num_layers=num_layers, **kwargs)


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_gru(x, h, cell):
    """Keras GRUCell (reset_after=True), gates in the order z, r, h."""
    kernel, recurrent, bias = (keras.ops.convert_to_numpy(w) for w in cell.weights)
    x_z, x_r, x_h = np.split(x @ kernel + bias[0], 3, axis=-1)
    h_z, h_r, h_h = np.split(h @ recurrent + bias[1], 3, axis=-1)
    z, r = np_sigmoid(x_z + h_z), np_sigmoid(x_r + h_r)
    return z * h + (1 - z) * np.tanh(x_h + r * h_h)


def decoder_pass(model, source, target_in):
    """Teacher-forced logits and attention weights from the model's own layers."""
    encoder, decoder = model.get_layer("encoder"), model.get_layer("decoder")
    logits, weights = decoder(
        target_in, encoder(source), source_mask=source != 0, return_attention_scores=True
    )
    return keras.ops.convert_to_numpy(logits), keras.ops.convert_to_numpy(weights)


def test_attention_weights_sum_to_one_and_skip_padding():
    model = small_model()
    source = np.concatenate([SOURCE, np.zeros((1, 5), "int32")])  # last row: all padding
    target_in = np.concatenate([TARGET_IN, TARGET_IN[:1]])
    logits, weights = decoder_pass(model, source, target_in)
    assert logits.shape == (4, 4, 14) and weights.shape == (4, 4, 5)
    valid = (source != 0)[:, None, :]  # (B, 1, S)
    assert_allclose(weights.sum(-1)[:3], 1.0, atol=1e-6)
    assert np.all(weights[np.broadcast_to(~valid, weights.shape)] == 0.0)
    assert np.all(weights[3] == 0.0) and np.all(np.isfinite(logits))  # nothing to attend to


def test_decoder_step_matches_numpy_reference():
    batch, source_len, units, embedding_dim, vocab = 2, 4, 5, 3, 7
    decoder = BahdanauDecoder(vocab, embedding_dim, units, num_layers=2)
    rng = np.random.default_rng(0)
    h = rng.normal(size=(batch, source_len, units)).astype("float32")
    s0 = [rng.normal(size=(batch, units)).astype("float32") for _ in range(2)]
    mask = np.array([[True, True, True, False], [True, True, False, False]])
    y = np.array([[4], [1]], "int32")
    logits, weights = decoder(y, (h, s0), source_mask=mask, return_attention_scores=True)
    # Scale every weight up so the attention is far from uniform.
    for w in decoder.weights:
        w.assign(w * 3.0)
    logits, weights = decoder(y, (h, s0), source_mask=mask, return_attention_scores=True)

    attention = decoder.cell.attention
    w_q, w_k, w_v = (keras.ops.convert_to_numpy(d.kernel) for d in (
        attention.query_dense, attention.key_dense, attention.score_dense))
    scores = (np.tanh((s0[1] @ w_q)[:, None, :] + h @ w_k) @ w_v)[..., 0]  # (B, S)
    scores = np.where(mask, scores, -np.inf)
    alpha = np.exp(scores - scores.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    context = np.einsum("bs,bsu->bu", alpha, h)
    embedded = keras.ops.convert_to_numpy(decoder.embedding.embeddings)[y[:, 0]]
    s1 = np_gru(np.concatenate([context, embedded], -1), s0[0], decoder.cell.grus[0])
    s2 = np_gru(s1, s0[1], decoder.cell.grus[1])
    dense = decoder.output_dense
    expected = s2 @ keras.ops.convert_to_numpy(dense.kernel) + keras.ops.convert_to_numpy(
        dense.bias)
    assert alpha.max() > 0.5  # a non-trivial case
    assert_allclose(keras.ops.convert_to_numpy(weights)[:, 0], alpha, atol=1e-5)
    assert_allclose(keras.ops.convert_to_numpy(logits)[:, 0], expected, atol=1e-4)


def test_decode_steps_equal_teacher_forced_pass():
    model = small_model()
    for w in model.weights:  # larger weights: differences would show
        w.assign(w * 2.0)
    logits, weights = decoder_pass(model, SOURCE, TARGET_IN)
    encoder, decoder = model.get_layer("encoder"), model.get_layer("decoder")
    state = decoder.init_decode_state(encoder(SOURCE), SOURCE, max_length=4)
    for index in range(TARGET_IN.shape[1]):
        step_logits, state, step_weights = decoder.decode_step(TARGET_IN[:, index], index, state,
                                                               return_attention_scores=True)
        assert dtype_of(step_logits) == "float32" and step_weights.shape == (3, 5)
        assert_allclose(step_logits, logits[:, index], atol=1e-5)
        assert_allclose(step_weights, weights[:, index], atol=1e-5)


def test_greedy_and_beam_search_follow_the_model():
    model = small_model()
    for w in model.weights:
        w.assign(w * 3.0)
    max_length = 6
    tokens, attention = decoding.generate(model, SOURCE, max_length,
                                          return_attention_scores=True)
    tokens, attention = as_np(tokens), as_np(attention)
    assert tokens.shape == (3, max_length) and attention.shape == (3, max_length, 5)
    # Fed back with teacher forcing, greedy's own tokens are the argmax of every step up to eos.
    target_in = np.concatenate([np.full((3, 1), 2, "int32"), tokens[:, :-1]], axis=1)
    logits, weights = decoder_pass(model, SOURCE, target_in)
    for row in range(3):
        ends = np.flatnonzero(tokens[row] == 3)
        length = ends[0] + 1 if len(ends) else max_length
        allowed = logits[row, :length].copy()
        allowed[:, [0, 2]] = -np.inf  # padding and <bos> are never emitted
        assert_array_equal(tokens[row, :length], allowed.argmax(-1))
        assert np.all(tokens[row, length:] == 0)
        assert_allclose(attention[row, :length], weights[row, :length], atol=1e-5)
    beam = decoding.generate(model, SOURCE, max_length, sampler=decoding.Beam(1))
    assert_array_equal(as_np(beam), tokens)
    assert as_np(decoding.generate(model, SOURCE, max_length,
                                   sampler=decoding.Beam(3))).shape == (
        3, max_length)


def test_encoder_final_states_skip_padding():
    encoder = BahdanauEncoder(16, 6, 8, num_layers=2)
    padded = np.array([[5, 6, 7, 0, 0]], "int32")
    outputs, states = encoder(padded)
    trimmed_outputs, trimmed_states = encoder(padded[:, :3])
    assert outputs.shape == (1, 5, 8) and len(states) == 2
    assert_allclose(outputs[:, :3], trimmed_outputs, atol=1e-6)
    for state, trimmed in zip(states, trimmed_states, strict=True):
        assert_allclose(state, trimmed, atol=1e-6)
    assert_allclose(states[-1], trimmed_outputs[:, -1], atol=1e-6)


def test_symbolic_attention_scores_and_configs():
    encoder = BahdanauEncoder(16, 6, 8, name="encoder")
    decoder = BahdanauDecoder(14, 6, 8, name="decoder")
    source = keras.Input((5,), dtype="int32")
    target_in = keras.Input((None,), dtype="int32")
    logits, weights = decoder(target_in, encoder(source), source_mask=keras.ops.not_equal(
        source, 0), return_attention_scores=True)
    assert logits.shape == (None, None, 14) and dtype_of(logits) == "float32"
    assert weights.shape == (None, None, 5)
    model = keras.Model([source, target_in], [logits, weights])
    eager = decoder_pass(model, SOURCE, TARGET_IN)
    for got, expected in zip(model([SOURCE, TARGET_IN]), eager, strict=True):
        assert_allclose(got, expected, atol=1e-6)
    for layer in (encoder, decoder, decoder.cell):
        config = layer.get_config()
        assert type(layer).from_config(config).get_config() == config


def test_save_and_load_give_identical_outputs(tmp_path):
    model = small_model(dropout=0.1, seed=3)
    path = str(tmp_path / "bahdanau.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert_array_equal(loaded([SOURCE, TARGET_IN]), model([SOURCE, TARGET_IN]))
    assert isinstance(loaded.get_layer("decoder").cell, BahdanauCell)
    assert_array_equal(
        decoding.generate(loaded, SOURCE, 5), decoding.generate(model, SOURCE, 5)
    )


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_fit_step(policy):
    keras.config.set_dtype_policy(policy)
    model = small_model(dropout=0.2)
    logits, weights = decoder_pass(model, SOURCE, TARGET_IN)
    assert dtype_of(logits) == "float32" and dtype_of(weights) == policy.split("_")[1]
    assert model.get_layer("decoder").output_dense.compute_dtype == policy.split("_")[1]
    model.compile(keras.optimizers.Adam(1e-3), loss=MaskedSequenceLoss())
    target_out = np.concatenate([TARGET_IN[:, 1:], np.zeros((3, 1), "int32")], axis=1)
    history = model.fit([SOURCE, TARGET_IN], target_out, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert as_np(decoding.generate(model, SOURCE, 4)).shape == (3, 4)


@pytest.mark.tf_only
def test_gradient_under_xla_with_unknown_lengths():
    # model.fit uses XLA on GPU by default; batch and lengths are unknown when the step traces.
    decoder = BahdanauDecoder(14, 6, 8, num_layers=2, dropout=0.2)
    encoder = BahdanauEncoder(16, 6, 8, num_layers=2)
    signature = [tf.TensorSpec([None, None], tf.int32)] * 2

    @tf.function(jit_compile=True, input_signature=signature)
    def gradients(source, target_in):
        with tf.GradientTape() as tape:
            logits = decoder(target_in, encoder(source), source_mask=source != 0, training=True)
            loss = tf.reduce_mean(logits**2)
        return loss, tape.gradient(loss, decoder.trainable_variables)

    loss, grads = gradients(SOURCE, TARGET_IN)
    assert np.isfinite(float(loss)) and len(grads) == len(decoder.trainable_variables)
    assert all(np.all(np.isfinite(tf.convert_to_tensor(g))) for g in grads)


def reversal_data(rng, count, vocab=10, min_len=3, max_len=8):
    """source = random tokens (ids 4..), target = the same reversed, then <eos>."""
    source = np.zeros((count, max_len), "int32")
    target = np.zeros((count, max_len + 2), "int32")  # <bos> y_1 .. y_n <eos>
    for i in range(count):
        length = rng.integers(min_len, max_len + 1)
        tokens = rng.integers(4, 4 + vocab, length)
        source[i, :length] = tokens
        target[i, : length + 2] = np.concatenate([[2], tokens[::-1], [3]])
    return source, target[:, :-1], target[:, 1:]


def test_learns_sequence_reversal():
    rng = np.random.default_rng(0)
    train, test = reversal_data(rng, 3000), reversal_data(rng, 200)
    model = bahdanau_seq2seq(14, 14, embedding_dim=16, units=32, num_layers=1, dropout=0.0)
    model.compile(keras.optimizers.Adam(0.01), loss=MaskedSequenceLoss(),
                  metrics=[MaskedAccuracy()])
    model.fit(list(train[:2]), train[2], batch_size=64, epochs=6, verbose=0)
    _, accuracy = model.evaluate(list(test[:2]), test[2], verbose=0)
    assert accuracy >= 0.9
    # Greedy decoding from <bos> alone, compared token by token with the reversed source.
    tokens = as_np(decoding.generate(model, test[0], max_length=9))
    valid = test[2] != 0
    assert np.mean(tokens[valid] == test[2][valid]) >= 0.9


@pytest.mark.parametrize(
    "build, name",
    [
        (lambda: BahdanauEncoder(0, 4, 4), "vocabulary_size"),
        (lambda: BahdanauEncoder(8, 4, 4, dropout=1.0), "dropout"),
        (lambda: BahdanauDecoder(8, -1, 4), "embedding_dim"),
        (lambda: BahdanauDecoder(8, 4, 0), "units"),
        (lambda: BahdanauDecoder(8, 4, 4, num_layers=1.5), "num_layers"),
        (lambda: BahdanauCell(4, num_layers=0), "num_layers"),
        (lambda: bahdanau_seq2seq(0, 8), "source_vocabulary_size"),
        (lambda: bahdanau_seq2seq(8, None), "target_vocabulary_size"),
    ],
)
def test_bad_arguments_raise(build, name):
    with pytest.raises(ValueError, match=f"`{name}`.*Received: {name}="):
        build()


@pytest.mark.parametrize("units, num_layers", [(6, 1), (8, 2)])
def test_encoder_decoder_mismatch_raises(units, num_layers):
    encoder_outputs = BahdanauEncoder(16, 6, units, num_layers=num_layers)(SOURCE)
    decoder = BahdanauDecoder(14, 6, 8, num_layers=1)
    with pytest.raises(ValueError, match="encoder_outputs"):
        decoder(TARGET_IN, encoder_outputs)
