"""Model-level LoRA (issue 24.5): `keras_attn.models.enable_lora(model, rank)` freezes a model
and adapts its attention projections; trained with `fit`, only the low-rank weights move; the
`.keras` round trip keeps the outputs; bad arguments are refused by name."""

import keras
import numpy as np
import pytest
from backend_utils import assert_allclose, to_np
from reference import greedy_tokens

import keras_attn as ka
from keras_attn.models import causal_lm, enable_lora

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it "
        "was the age of foolishness, it was the epoch of belief, it was the epoch of "
        "incredulity, it was the season of Light, it was the season of Darkness.")
CHARS = sorted(set(TEXT))
VOCAB = len(CHARS) + 4  # ids 0-3 reserved (keras_attn.tokens)
SIZES = {"num_layers": 2, "hidden_dim": 32, "num_heads": 4, "intermediate_dim": 48}


def text_batches(length=16):
    """The text as character ids, cut into (x, y) rows of `length` next-token pairs."""
    ids = np.array([CHARS.index(c) + 4 for c in TEXT], "int32")
    rows = len(ids) // (length + 1)
    windows = ids[:rows * (length + 1)].reshape(rows, length + 1)
    return windows[:, :-1], windows[:, 1:]


def lm(**kwargs):
    keras.utils.set_random_seed(0)
    return causal_lm(VOCAB, **SIZES, **kwargs)


@pytest.mark.parametrize("kwargs", [
    {},  # LLaMA style: RoPE, RMSNorm, SwiGLU
    {"position_encoding": "learned", "max_sequence_length": 32, "norm": "layer",
     "activation": "gelu_tanh", "tie_word_embeddings": True, "num_key_value_heads": 2},
])
def test_fit_trains_the_low_rank_weights_only(kwargs):
    model = lm(**kwargs)
    x, y = text_batches()
    before = to_np(model(x))
    frozen = {w.path: to_np(w) for w in model.weights}
    paths = enable_lora(model, rank=4)
    assert paths == [f"decoder/block_{i}/self_attention/{name}_dense"
                     for i in range(2) for name in ("query", "value")]
    assert sorted(w.path for w in model.trainable_weights) == sorted(
        f"{path}/lora_kernel_{ab}" for path in paths for ab in "ab")
    assert_allclose(to_np(model(x)), before, atol=0)  # B starts at zero: nothing changed yet
    model.compile(keras.optimizers.Adam(1e-2), ka.metrics.MaskedSequenceLoss())
    losses = model.fit(x, y, batch_size=4, epochs=4, verbose=0).history["loss"]
    assert losses[-1] < losses[0] - 0.05
    for w in model.weights:
        if "lora_kernel" in w.path:
            continue
        np.testing.assert_array_equal(to_np(w), frozen[w.path], err_msg=w.path)
    lora_b = [to_np(w) for w in model.weights if w.path.endswith("lora_kernel_b")]
    assert len(lora_b) == 4 and all(np.abs(b).max() > 1e-4 for b in lora_b)
    assert np.abs(to_np(model(x)) - before).max() > 1e-3


def test_a_lora_model_saves_and_loads_with_equal_outputs_and_generates(tmp_path):
    model = lm(num_key_value_heads=2)
    x, y = text_batches()
    enable_lora(model, rank=2, target_names=("query", "key", "value", "output"), alpha=4.0)
    model.compile(keras.optimizers.Adam(1e-2), ka.metrics.MaskedSequenceLoss())
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    outputs = to_np(model(x))
    path = tmp_path / "lora.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True, compile=False)
    # The file holds the merged kernels W + (alpha / rank) A B.
    assert_allclose(to_np(loaded(x)), outputs, atol=1e-5)
    prompt = x[:2, :4]
    tokens = to_np(ka.decoding.generate(model, prompt, 12, stop_token_ids=None))
    assert_allclose(to_np(ka.decoding.generate(loaded, prompt, 12, stop_token_ids=None)),
                    tokens,
                    atol=0)
    # Incremental decoding with the LoRA projections equals the full forward pass.
    full = greedy_tokens(to_np(model(tokens[:, :-1])))
    np.testing.assert_array_equal(full[:, 3:], tokens[:, 4:])
    assert enable_lora(loaded, rank=2)  # a loaded (merged) model adapts again


@pytest.mark.parametrize("kwargs, name", [
    ({"rank": 0}, "rank"), ({"rank": -2}, "rank"), ({"rank": 2.5}, "rank"),
    ({"rank": True}, "rank"), ({"rank": 2, "target_names": ()}, "target_names"),
    ({"rank": 2, "target_names": "nonexistent"}, "target_names"),
    ({"rank": 2, "target_names": [3]}, "target_names"),
    ({"rank": 2, "alpha": 0.0}, "alpha"), ({"rank": 2, "alpha": float("nan")}, "alpha"),
])
def test_bad_arguments_are_refused_by_name(kwargs, name):
    model = lm()
    with pytest.raises(ValueError, match=f"`{name}`"):
        enable_lora(model, **kwargs)
    assert len(model.trainable_weights) == len(model.weights)  # nothing frozen by a refusal


def test_twice_an_unbuilt_model_and_a_non_model_are_refused():
    model = lm()
    enable_lora(model, 2)
    with pytest.raises(ValueError, match="`model` already has LoRA"):
        enable_lora(model, 2)
    with pytest.raises(ValueError, match="`model` must be built"):
        enable_lora(ka.models.TransformerDecoderOnly(
            VOCAB, num_layers=2, hidden_dim=32,
            block=ka.BlockConfig(ka.AttentionConfig(num_heads=4), intermediate_dim=48)), 2)
    with pytest.raises(ValueError, match="`model`"):
        enable_lora("model", 2)


def test_int8_quantized_projections_take_lora():
    model = lm()
    x, y = text_batches()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    int8 = {w.path: to_np(w) for w in model.weights if "int8" in str(w.dtype)}
    enable_lora(model, rank=2)
    model.compile(keras.optimizers.Adam(1e-2), ka.metrics.MaskedSequenceLoss())
    losses = model.fit(x, y, batch_size=4, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    assert int8 and all(np.array_equal(to_np(w), int8[w.path])
                        for w in model.weights if w.path in int8)
