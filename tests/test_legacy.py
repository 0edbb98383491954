"""`.keras` files of the previous release load with the same outputs.

`tests/fixtures/layers_v0.keras` was saved by the 0.1 code (`tests/fixtures/make_layers_v0.py`):
MultiHead with grouped-query heads and RoPE, a gated MultiHead, LocalMultiHead(window=2), linear,
additive, ALiBi and T5 attention, a SwiGLU FFN and the two position-bias layers, with its inputs
and outputs in `layers_v0.npz`.
"""

import pathlib
import warnings

import keras
import numpy as np
from backend_utils import rand, to_np

import keras_attn as ka

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def test_the_previous_release_file_loads_with_the_same_outputs():
    data = np.load(FIXTURES / "layers_v0.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = keras.saving.load_model(FIXTURES / "layers_v0.keras", safe_mode=True)
    inputs = {name[len("input_"):]: data[name] for name in data if name.startswith("input_")}
    outputs = model(inputs)
    for i, got in enumerate(outputs):
        np.testing.assert_allclose(to_np(got), data[f"output_{i}"], rtol=1e-5, atol=1e-5)
    assert model.get_layer("local").sliding_window == 3  # window=2: |p - j| <= 2


def test_the_deprecated_window_spelling_means_one_more_sliding_window():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = ka.LocalMultiHead(num_heads=2, key_dim=4, window=2)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    new = ka.LocalMultiHead(num_heads=2, key_dim=4, sliding_window=3)
    x = rand(1, 7, 8)
    old(x)
    new(x)
    new.set_weights(old.get_weights())
    np.testing.assert_array_equal(to_np(old(x)), to_np(new(x)))
    assert old.get_config()["sliding_window"] == 3 and "window" not in old.get_config()
