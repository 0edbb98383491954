"""`.keras` files saved by keras_attn 0.1.0 and 0.2.0 load with today's code, without a warning,
and give the same outputs, through a full pass and (0.1's) through the decoding loops.

`tests/fixtures/make_models_v0.py` wrote 0.1's with random weights, biases and norms included;
`tests/fixtures/make_models_v02.py` wrote 0.2's, whose configs hold the names 0.3 renamed (flat
block arguments, `use_bias` naming parts, `gated_ffn`, `tie_embeddings`, `FFN(hidden_dim)`,
`MultiHead(output_dim)`, `PatchEmbedding(embed_dim)`, BERT's parts by composition)."""

import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
from backend_utils import to_np

from keras_attn import decoding

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NAMES = ("transformer_seq2seq", "causal_lm_rope_gqa", "causal_lm_learned_tied", "nat_seq2seq",
         "bahdanau_seq2seq")
NAMES_V02 = ("decoder_only_qwen", "decoder_only_gpt2_gated", "bert_by_composition", "layers")


def decode(name, model, inputs):
    """Today's spelling of the greedy decoding `tests/fixtures/make_models_v0.py` recorded."""
    if name.startswith("causal_lm"):
        return decoding.generate(model, np.array([[2, 5, 6, 0], [2, 9, 0, 0]], "int32"), 10)
    if name.startswith("nat"):
        return decoding.mask_predict(model, inputs[0], iterations=2)[0]
    return decoding.generate(model, inputs[0], 6)


@pytest.fixture(scope="module")
def arrays():
    arrays = {}
    for release in ("v0", "v02"):
        with np.load(FIXTURES / f"models_{release}.npz") as data:
            arrays.update({f"{release}/{key}": value for key, value in data.items()})
    return arrays


def load_and_run(release: str, name: str, arrays: dict):
    """The model of `models_<release>_<name>.keras`, loaded without a deprecation warning, its
    recorded inputs, and its outputs compared with the recorded ones."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.saving.load_model(FIXTURES / f"models_{release}_{name}.keras",
                                        safe_mode=True)
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert not said, said
    prefix = f"{release}/{name}"
    inputs = [arrays[k] for k in sorted(arrays) if k.startswith(f"{prefix}/input_")]
    expected = [arrays[k] for k in sorted(arrays) if k.startswith(f"{prefix}/output_")]
    outputs = model(inputs if len(inputs) > 1 else inputs[0])
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(to_np(got), want, rtol=1e-4, atol=1e-4)
    return model, inputs


@pytest.mark.parametrize("name", NAMES)
def test_a_model_saved_by_keras_attn_0_1_loads_with_the_same_outputs(name, arrays):
    model, inputs = load_and_run("v0", name, arrays)
    np.testing.assert_array_equal(to_np(decode(name, model, inputs)),
                                  arrays[f"v0/{name}/decoded"])


@pytest.mark.parametrize("name", NAMES_V02)
def test_a_model_saved_by_keras_attn_0_2_loads_with_the_same_outputs(name, arrays):
    load_and_run("v02", name, arrays)
