"""`.keras` files saved by keras_attn 0.1.0 load with today's code and give the same outputs,
through a full pass and through the decoding loops (`tests/fixtures/make_models_v0.py` wrote
them with random weights, biases and norms included)."""

from pathlib import Path

import keras
import numpy as np
import pytest
from backend_utils import to_np

from keras_attn import decoding

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NAMES = ("transformer_seq2seq", "causal_lm_rope_gqa", "causal_lm_learned_tied", "nat_seq2seq",
         "bahdanau_seq2seq")


def decode(name, model, inputs):
    """Today's spelling of the greedy decoding `tests/fixtures/make_models_v0.py` recorded."""
    if name.startswith("causal_lm"):
        return decoding.generate(model, np.array([[2, 5, 6, 0], [2, 9, 0, 0]], "int32"), 10)
    if name.startswith("nat"):
        return decoding.mask_predict(model, inputs[0], iterations=2)[0]
    return decoding.generate(model, inputs[0], 6)


@pytest.fixture(scope="module")
def arrays():
    with np.load(FIXTURES / "models_v0.npz") as data:
        return dict(data)


@pytest.mark.parametrize("name", NAMES)
def test_a_model_saved_by_the_previous_release_loads_with_the_same_outputs(name, arrays):
    model = keras.saving.load_model(FIXTURES / f"models_v0_{name}.keras", safe_mode=True)
    inputs = [arrays[k] for k in sorted(arrays) if k.startswith(f"{name}/input_")]
    expected = [arrays[k] for k in sorted(arrays) if k.startswith(f"{name}/output_")]
    outputs = model(inputs if len(inputs) > 1 else inputs[0])
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(to_np(got), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(to_np(decode(name, model, inputs)), arrays[f"{name}/decoded"])
