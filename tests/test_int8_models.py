"""int8 language models for every position scheme, tied and untied (issue 24.5):
`model.quantize("int8")` keeps the logits close to float32 (relative to their spread), the
quantized model decodes one token at a time exactly as it runs the whole sequence, and it saves
and loads back with identical outputs and int8 kernels."""

import warnings

import keras
import numpy as np
import pytest
from backend_utils import assert_allclose, dtype_of, to_np
from reference import greedy_tokens

import keras_attn as ka
from keras_attn.models import causal_lm

IDS = np.random.default_rng(0).integers(4, 40, (2, 9)).astype("int32")
SIZES = {"num_layers": 2, "hidden_dim": 32, "num_heads": 4, "intermediate_dim": 48,
         "num_key_value_heads": 2}
SCHEMES = ["learned", "sinusoidal", "rope", "alibi", "relative"]


def quantized_pair(position_encoding, tie_word_embeddings):
    """A float32 model and its int8 copy (same weights)."""
    keras.utils.set_random_seed(0)
    model = causal_lm(40, **SIZES, position_encoding=position_encoding, max_sequence_length=16,
                      tie_word_embeddings=tie_word_embeddings)
    reference = to_np(model(IDS))
    with warnings.catch_warnings():  # Keras warns about every layer it leaves as it is
        warnings.simplefilter("ignore")
        model.quantize("int8")
    return model, reference


def int8_paths(model):
    return sorted(w.path for w in model.weights
                  if keras.backend.standardize_dtype(w.dtype) == "int8")


def _grid():
    """Every scheme tied and untied; the default run keeps each scheme once, tied and untied
    alternating (both table paths, every cache path), the other half is marked slow."""
    for index, scheme in enumerate(SCHEMES):
        for tied in (False, True):
            marks = () if tied == (index % 2 == 0) else (pytest.mark.slow,)
            yield pytest.param(scheme, tied, marks=marks,
                               id=f"{scheme}-{'tied' if tied else 'untied'}")


@pytest.mark.parametrize(("position_encoding", "tie_word_embeddings"), list(_grid()))
def test_int8_logits_stay_close_decode_as_they_run_and_load_back(position_encoding,
                                                                 tie_word_embeddings, tmp_path):
    model, reference = quantized_pair(position_encoding, tie_word_embeddings)
    decoder = model.get_layer("decoder")
    assert decoder.blocks[0].self_attention.query_dense.quantization_mode == "int8"
    head = decoder.embedding.token_embedding if tie_word_embeddings else decoder.head
    assert any(dtype_of(variable) == "int8" for variable in head.weights)
    error = to_np(model(IDS)) - reference
    spread = reference.std()
    # int8 weights and activations (per channel / per token): about 2-3% of the logits'
    # spread measured; a lost scale (the tied table read raw) is off by a factor of 100s.
    assert np.sqrt(np.mean(error ** 2)) < 0.05 * spread
    assert np.abs(error).max() < 0.3 * spread
    prompt = IDS[:, :3]
    tokens = to_np(ka.decoding.generate(model, prompt, 12, stop_token_ids=None))
    # Incremental decoding over the int8 cache path equals the whole sequence at once
    # (activations are quantized per token, so each position sees the same numbers).
    full = greedy_tokens(to_np(model(tokens[:, :-1])))
    np.testing.assert_array_equal(full[:, 2:], tokens[:, 3:])
    outputs = to_np(model(IDS))
    path = tmp_path / "int8.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert int8_paths(loaded) == int8_paths(model)
    assert len(int8_paths(model)) >= 2 * 4 + 1  # q, k, v, output per block; the head
    assert_allclose(to_np(loaded(IDS)), outputs, atol=1e-6)
    np.testing.assert_array_equal(
        to_np(ka.decoding.generate(loaded, prompt, 12, stop_token_ids=None)), tokens)
