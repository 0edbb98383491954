"""Models under int8 quantization (tied heads, every position scheme, saved and loaded back) and
inputs longer than the learned positions inside `fit` and `predict` (issue 26: 1, 13, 15, 20)."""

import warnings

import keras
import numpy as np
import pytest
from backend_utils import as_np, assert_allclose, randomize, to_np

from keras_attn.layers import TokenAndPositionEmbedding
from keras_attn.models import causal_lm, nat_seq2seq, transformer_seq2seq

IDS = np.random.default_rng(0).integers(4, 40, (2, 9)).astype("int32")
SOURCE = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 0, 0]], "int32")
TARGET = np.array([[2, 5, 9, 11], [2, 13, 14, 0]], "int32")
SIZES = {"num_layers": 2, "hidden_dim": 32, "num_heads": 4, "intermediate_dim": 48}


def quantize(model):
    with warnings.catch_warnings():  # Keras warns about every layer it leaves as it is
        warnings.simplefilter("ignore")
        model.quantize("int8")


@pytest.mark.parametrize("kwargs", [
    {"tie_word_embeddings": True},
    {"tie_word_embeddings": True, "position_encoding": "learned", "max_sequence_length": 12,
     "norm": "layer", "activation": "gelu_tanh"},
])
def test_tied_logits_after_int8_quantization_keep_the_table_scale(kwargs):
    model = causal_lm(40, **SIZES, **kwargs)
    randomize(model)
    before = to_np(model(IDS))
    quantize(model)
    decoder = model.get_layer("decoder")
    assert decoder.embedding.token_embedding.quantization_mode == "int8"
    after = to_np(model(IDS))
    # int8 weights and activations: a few percent of the logits' range, not a factor of
    # thousands (the raw int8 table without its scale).
    assert np.abs(after - before).max() < 0.15 * np.abs(before).max()
    assert (after.argmax(-1) == before.argmax(-1)).mean() >= 0.9


@pytest.mark.parametrize("position_encoding", ["rope", "alibi", "relative", "learned",
                                               "sinusoidal"])
def test_every_position_scheme_quantizes(position_encoding):
    model = causal_lm(40, **SIZES, position_encoding=position_encoding, max_sequence_length=12)
    randomize(model)
    before = to_np(model(IDS))
    quantize(model)
    dense = model.get_layer("decoder").blocks[0].self_attention.query_dense
    assert dense.quantization_mode == "int8"
    after = to_np(model(IDS))
    assert np.abs(after - before).max() < 0.15 * np.abs(before).max()


@pytest.mark.parametrize("name", ["causal_lm_rope", "causal_lm_tied", "transformer_seq2seq",
                                  "nat_seq2seq"])
def test_quantized_models_save_and_load_back_with_identical_outputs(name, tmp_path):
    model, inputs = {
        "causal_lm_rope": (lambda: causal_lm(40, **SIZES, num_key_value_heads=2), IDS),
        "causal_lm_tied": (lambda: causal_lm(40, **SIZES, tie_word_embeddings=True), IDS),
        "transformer_seq2seq": (lambda: transformer_seq2seq(20, 22, **SIZES), [SOURCE, TARGET]),
        "nat_seq2seq": (lambda: nat_seq2seq(20, 22, **SIZES, max_target_length=6),
                        [SOURCE, TARGET]),
    }[name]
    model = model()
    randomize(model)
    quantize(model)
    outputs = model(inputs)
    path = tmp_path / "quantized.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    kernels = [w for w in loaded.weights if "int8" in keras.backend.standardize_dtype(w.dtype)]
    assert len(kernels) >= SIZES["num_layers"] * 4  # the projections stayed int8
    for got, want in zip(keras.tree.flatten(loaded(inputs)), keras.tree.flatten(outputs)):
        assert_allclose(to_np(got), to_np(want), atol=1e-6)


# ---- inputs longer than the learned positions --------------------------------------------------


def _batches(x, y=None):
    """The data as `fit` gets it: on TensorFlow a dataset whose length is unknown until it
    runs (the graph then cannot check it when it is traced); arrays elsewhere."""
    if keras.backend.backend() != "tensorflow":
        return {"x": x} if y is None else {"x": x, "y": y}
    import tensorflow as tf

    spec = tf.TensorSpec([None, None], tf.int32)
    if y is None:
        return {"x": tf.data.Dataset.from_generator(lambda: iter([x]), output_signature=spec)}
    return {"x": tf.data.Dataset.from_generator(lambda: iter([(x, y)]),
                                                output_signature=(spec, spec))}


def _refused(sequence_length=6):
    errors = (ValueError,)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        errors += (tf.errors.InvalidArgumentError,)  # the check inside the graph
    return pytest.raises(errors,
                         match=f"more positions than the sequence_length={sequence_length}")


@pytest.mark.parametrize("call", ["predict", "fit", "evaluate"])
def test_an_input_longer_than_the_learned_positions_is_refused_inside_fit_and_predict(call):
    model = causal_lm(40, **SIZES, position_encoding="learned", max_sequence_length=6)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = _batches(IDS) if call == "predict" else _batches(IDS[:, :-1], IDS[:, 1:])
    with _refused():
        getattr(model, call)(**data, verbose=0)
    # Up to the table's length it runs (a fresh model: Keras' JAX trainer leaves the variables
    # of a model whose `predict` raised without values).
    model = causal_lm(40, **SIZES, position_encoding="learned", max_sequence_length=6)
    assert model.predict(**_batches(IDS[:, :6]), verbose=0).shape == (2, 6, 40)


def test_token_and_position_embedding_refuses_long_inputs_in_a_model():
    ids = keras.Input((None,), dtype="int32")
    model = keras.Model(ids, TokenAndPositionEmbedding(40, 4, 8)(ids))
    with pytest.raises(ValueError, match="sequence_length=4"):
        model(IDS)
    with _refused(4):
        model.predict(**_batches(IDS), verbose=0)  # issue 26.20: a bare GatherV2 error once
    model = keras.Model(ids, TokenAndPositionEmbedding(40, 4, 8)(ids))
    assert as_np(model.predict(IDS[:, :4], verbose=0)).shape == (2, 4, 8)


@pytest.mark.tf_only
def test_in_a_graph_of_unknown_length_the_check_is_an_assertion_with_the_same_message():
    import tensorflow as tf

    model = causal_lm(40, **SIZES, position_encoding="learned", max_sequence_length=6)
    graph = tf.function(model, input_signature=[tf.TensorSpec([None, None], tf.int32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="sequence_length=6"):
        graph(IDS)
    assert graph(IDS[:, :6]).shape == (2, 6, 40)
