"""keras_attn.checkpoints.build_model: Hugging Face and keras-hub checkpoints as keras_attn
models compute what torch and keras-hub compute (logits, padded batches, BERT's hidden
states), generate the same greedy tokens with the checkpoint's own ids, load bfloat16, and
refuse what the assembly cannot express."""

import checkpoint_fixtures as fx
import keras
import numpy as np
import pytest
from layer_test_utils import run_layer_test

from keras_attn import decoding
from keras_attn.checkpoints import (
    build_model,
    canonical_from_keras_hub,
    from_pretrained,
    generation_ids,
    load_hf_checkpoint,
    set_weights,
    spec_from_keras_hub,
)
from keras_attn.layers import FrequencyRotaryEmbedding, RotaryEmbedding

CAUSAL = [name for name, (cls, *_rest) in fx.CHECKPOINTS.items() if "CausalLM" in cls
          or "LMHead" in cls]


def model_inputs(spec, ids, mask, segments=None):
    inputs = {"token_ids": np.asarray(ids, "int32"), "padding_mask": np.asarray(mask, bool)}
    if spec.architecture == "bert":
        inputs["segment_ids"] = np.asarray(
            np.zeros_like(ids) if segments is None else segments, "int32")
    return inputs


def outputs_of(model, inputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, model(inputs))


@pytest.mark.parametrize("name", list(fx.CHECKPOINTS))
def test_hf_checkpoint_outputs_match_torch(name):
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint(name), dtype="float32")
    model = build_model(spec, weights)
    expected = fx.expected(name)
    mask = expected["mask"]  # the second row is padded after 5 tokens
    ours = outputs_of(model, model_inputs(spec, expected["ids"], mask,
                                          expected["token_type_ids"]))
    if spec.task == "encoder":
        assert np.abs(ours["sequence_output"][mask] - expected["hidden"][mask]).max() < 1e-4
        assert np.abs(ours["pooled_output"] - expected["pooled"]).max() < 1e-4
    else:
        assert ours.dtype == np.float32
        assert np.abs(ours[mask] - expected["logits"][mask]).max() < 1e-4, name


@pytest.mark.parametrize("name", CAUSAL)
def test_greedy_generation_matches_transformers(name):
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint(name), dtype="float32")
    model = build_model(spec, weights)
    expected = fx.expected(name)["generated"]  # greedy, 20 new tokens, the end ids banned
    ids = generation_ids(spec)
    tokens = decoding.generate(model, expected[:, :5], max_length=25, stop_token_ids=None,
                               pad_id=ids["pad_id"], suppressed_ids=spec.eos_token_ids)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens), expected)


def test_generation_ids_are_the_checkpoints():
    llama3 = load_hf_checkpoint(fx.hf_checkpoint("llama3"))[0]
    ids = generation_ids(llama3)  # two end ids, from generation_config.json
    assert ids == {"stop_token_ids": llama3.eos_token_ids, "pad_id": llama3.eos_token_ids[0],
                   "suppressed_ids": ()}
    assert len(llama3.eos_token_ids) == 2
    llama = load_hf_checkpoint(fx.hf_checkpoint("llama"))[0]  # no pad id: its end id pads
    assert llama.pad_token_id is None
    assert generation_ids(llama) == {"stop_token_ids": 2, "pad_id": 2, "suppressed_ids": ()}


def test_padded_prompts_and_end_ids():
    """Right-padded prompts (padded with the checkpoint's end id, Llama's id 0 being a real
    token) continue as each prompt alone, and a row stops at any of its end ids."""
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama"), dtype="float32")
    model = build_model(spec, weights)
    ids = generation_ids(spec)
    prompts = np.array([[1, 0, 37, 5, 9], [1, 0, 44, ids["pad_id"], ids["pad_id"]]], "int32")
    together = keras.ops.convert_to_numpy(decoding.generate(
        model, prompts, max_length=16, stop_token_ids=None, pad_id=ids["pad_id"],
        suppressed_ids=()))
    alone = keras.ops.convert_to_numpy(decoding.generate(
        model, prompts[1:, :3], max_length=14, stop_token_ids=None, pad_id=ids["pad_id"],
        suppressed_ids=()))
    np.testing.assert_array_equal(together[1, :14], alone[0])
    # A prompt ending in the padding id itself: its length says where it ends.
    ending = np.array([[1, 0, ids["pad_id"], 7]], "int32")
    by_length = keras.ops.convert_to_numpy(decoding.generate(
        model, ending, max_length=12, stop_token_ids=None, pad_id=ids["pad_id"], suppressed_ids=(),
        prompt_lengths=np.array([3], "int32")))
    other_pad = keras.ops.convert_to_numpy(decoding.generate(
        model, ending[:, :3], max_length=12, stop_token_ids=None, pad_id=5, suppressed_ids=()))
    np.testing.assert_array_equal(by_length[:, 3:], other_pad[:, 3:])
    sampled = [keras.ops.convert_to_numpy(decoding.generate(
        model, prompts, max_length=16, sampler=decoding.TopP(0.95, temperature=1.5, seed=3),
        **ids)) for _ in range(2)]
    np.testing.assert_array_equal(sampled[0], sampled[1])  # seeded
    assert (sampled[0][:, 5:] != together[:, 5:]).any()  # not the greedy continuation
    with pytest.raises(ValueError, match="prompt_lengths"):
        decoding.generate(model, ending, max_length=12, pad_id=ids["pad_id"],
                          prompt_lengths=np.array([5], "int32"))
    # An end id the model chose, declared as one of two: the row stops right after it.
    first_new = int(together[0, 5])
    other = (first_new + 1) % spec.vocabulary_size
    stopped = keras.ops.convert_to_numpy(decoding.generate(
        model, prompts[:1], max_length=16, stop_token_ids=(other, first_new),
        pad_id=ids["pad_id"], suppressed_ids=()))
    np.testing.assert_array_equal(stopped[0, :6], together[0, :6])
    assert (stopped[0, 6:] == ids["pad_id"]).all()


def test_bert_ignores_what_padding_holds():
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("bert"))
    model = build_model(spec, weights)
    expected = fx.expected("bert")
    ids, types = expected["ids"], expected["token_type_ids"]
    mask = np.ones_like(ids, bool)
    mask[:, 4:] = False
    garbage = ids.copy()
    garbage[:, 4:] = (ids[:, 4:] + 7) % spec.vocabulary_size
    padded = outputs_of(model, model_inputs(spec, garbage, mask, types))
    short = outputs_of(model, model_inputs(spec, ids[:, :4], mask[:, :4], types[:, :4]))
    np.testing.assert_allclose(padded["sequence_output"][:, :4], short["sequence_output"],
                               atol=1e-5)
    np.testing.assert_allclose(padded["pooled_output"], short["pooled_output"], atol=1e-5)


def test_bfloat16_checkpoint_loads_as_bfloat16_or_float32():
    directory = fx.hf_checkpoint("llama_bf16")
    expected = fx.expected("llama_bf16")  # torch's float32 logits of the bfloat16 weights
    model, tokenizer, spec = from_pretrained(directory, tokenizer=False)
    assert tokenizer is None and spec.dtype == "bfloat16"
    assert {v.dtype for v in model.weights} == {"bfloat16"}
    mask = expected["mask"]
    inputs = model_inputs(spec, expected["ids"], mask)
    low = outputs_of(model, inputs)
    as_float32, _, _ = from_pretrained(directory, dtype="float32", tokenizer=False)
    assert {v.dtype for v in as_float32.weights} == {"float32"}
    high = outputs_of(as_float32, inputs)
    assert np.abs(high[mask] - expected["logits"][mask]).max() < 1e-4
    scale = np.abs(expected["logits"][mask]).max()
    error = np.abs(low[mask] - expected["logits"][mask]).max()
    assert 1e-4 < error < 0.05 * scale  # bfloat16 arithmetic: close, not equal


@pytest.mark.parametrize("name", ["llama3", "bert_mlm"])
def test_keras_file_round_trip(name, tmp_path):
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint(name), dtype="float32")
    model = build_model(spec, weights)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    expected = fx.expected(name)
    inputs = model_inputs(spec, expected["ids"], expected["mask"], expected["token_type_ids"])
    np.testing.assert_array_equal(outputs_of(loaded, inputs), outputs_of(model, inputs))


def test_frequency_rotary_embedding_keeps_the_layer_contract(tmp_path):
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    run_layer_test(FrequencyRotaryEmbedding, {"inverse_frequencies": [1.0, 0.3, 0.1, 0.01]},
                   {"inputs": x}, (2, 5, 8), tmp_path)


def test_frequency_rotary_embedding():
    x = np.random.default_rng(0).normal(size=(2, 5, 3, 8)).astype("float32")
    default = RotaryEmbedding(max_wavelength=100.0)
    frequencies = [100.0 ** (-i / 4) for i in range(4)]
    given = FrequencyRotaryEmbedding(frequencies)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(given(x)),
                               keras.ops.convert_to_numpy(default(x)), atol=1e-6)
    halved = FrequencyRotaryEmbedding([f / 2 for f in frequencies])
    assert np.abs(keras.ops.convert_to_numpy(halved(x) - given(x))).max() > 0.1
    restored = FrequencyRotaryEmbedding.from_config(given.get_config())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(restored(x)),
                                  keras.ops.convert_to_numpy(given(x)))
    with pytest.raises(ValueError, match="inverse_frequencies"):
        FrequencyRotaryEmbedding([1.0, -0.5])
    with pytest.raises(ValueError, match="twice"):
        FrequencyRotaryEmbedding([1.0, 0.5])(x)


def test_frequency_rotary_embedding_attention_scaling():
    """YaRN's scaling of cos and sin: the rotated features times the factor, kept through
    the config; refused unless a positive number."""
    x = np.random.default_rng(2).normal(size=(2, 5, 3, 8)).astype("float32")
    plain = FrequencyRotaryEmbedding([1.0, 0.3, 0.1, 0.01])
    scaled = FrequencyRotaryEmbedding([1.0, 0.3, 0.1, 0.01], attention_scaling=1.25)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(scaled(x)),
                               1.25 * keras.ops.convert_to_numpy(plain(x)), rtol=1e-6,
                               atol=1e-6)
    restored = FrequencyRotaryEmbedding.from_config(scaled.get_config())
    assert restored.attention_scaling == 1.25
    for bad in (0.0, -1.0, float("nan"), "2"):
        with pytest.raises(ValueError, match="attention_scaling"):
            FrequencyRotaryEmbedding([1.0], attention_scaling=bad)


def test_yarn_scaling_changes_the_logits():
    """Read as plain RoPE (the `rope_scaling` beside `rope_parameters` ignored), the YaRN
    fixture's logits are far from transformers'; read as transformers reads it, equal
    (`test_hf_checkpoint_outputs_match_torch`)."""
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama_yarn"), dtype="float32")
    plain = spec.replace(rope_type="default", rope_factor=None, rope_attention_scaling=1.0,
                         rope_original_max_positions=None, rope_beta_fast=None)
    expected = fx.expected("llama_yarn")
    inputs = model_inputs(spec, expected["ids"], expected["mask"])
    mask = expected["mask"]
    ours = outputs_of(build_model(spec, weights), inputs)
    wrong = outputs_of(build_model(plain, weights), inputs)
    assert np.abs(ours[mask] - expected["logits"][mask]).max() < 1e-4
    assert np.abs(wrong[mask] - expected["logits"][mask]).max() > 0.1


def test_arguments_that_are_not_what_they_name_are_refused():
    """Each was an AttributeError, TypeError or ZeroDivisionError."""
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama"), dtype="float32")
    model = build_model(spec)
    for call, name in ((lambda: generation_ids(None), "spec"),
                       (lambda: set_weights(model, spec, None), "weights"),
                       (lambda: set_weights(model, None, weights), "spec"),
                       (lambda: spec.replace(num_key_value_heads=0), "num_key_value_heads"),
                       (lambda: spec.replace(head_dim=-4), "head_dim"),
                       (lambda: spec.replace(vocabulary_size=2.5), "vocabulary_size")):
        with pytest.raises(ValueError, match=f"rgument `{name}`"):
            call()


def test_what_the_assembly_cannot_express_is_refused():
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama"), dtype="float32")
    with pytest.raises(ValueError, match="final_norm"):
        build_model(spec.replace(final_norm=False))
    with pytest.raises(ValueError, match="embedding_dropout"):
        build_model(spec.replace(embedding_dropout=0.1))
    with pytest.raises(ValueError, match="attention_dropout"):
        build_model(spec.replace(attention_dropout=0.1))
    with pytest.raises(ValueError, match="dtype"):
        build_model(spec, weights, dtype="int8")
    with pytest.raises(ValueError, match="implementation"):
        build_model(spec, weights, implementation="flash")
    with pytest.raises(ValueError, match="`spec`"):
        build_model({"architecture": "llama"})
    bert = load_hf_checkpoint(fx.hf_checkpoint("bert"))[0]
    with pytest.raises(ValueError, match="gated_ffn"):
        build_model(bert.replace(gated_ffn=True))
    model = build_model(spec)
    incomplete = dict(weights)
    del incomplete["layers/1/ffn/gate/kernel"]
    with pytest.raises(ValueError, match="layers/1/ffn/gate/kernel"):
        set_weights(model, spec, incomplete)
    gpt2 = load_hf_checkpoint(fx.hf_checkpoint("gpt2"))[0]
    with pytest.raises(ValueError, match="max_sequence_length"):
        build_model(gpt2, max_sequence_length=gpt2.max_sequence_length + 1)


KERAS_HUB = ("gpt2", "llama", "llama3", "mistral", "bert", "bert_mlm")


def keras_hub_inputs(model, ids, mask):
    inputs = {"token_ids": ids, "padding_mask": mask}
    backbone = getattr(model, "backbone", model)
    if "segment_ids" in backbone.input:
        inputs["segment_ids"] = np.zeros_like(ids)
    if hasattr(model, "backbone") and "mask_positions" in model.input:
        inputs["mask_positions"] = np.repeat(np.arange(ids.shape[1])[None], len(ids), axis=0)
    return inputs


@pytest.mark.parametrize("name", KERAS_HUB)
def test_keras_hub_models_match_keras_hub(name):
    theirs = fx.keras_hub_model(name)
    spec = spec_from_keras_hub(theirs)
    model = build_model(spec, canonical_from_keras_hub(theirs))
    ids = np.random.default_rng(1).integers(0, spec.vocabulary_size, size=(2, 7)).astype("int32")
    mask = np.ones_like(ids, bool)
    ours = outputs_of(model, model_inputs(spec, ids, mask))
    expected = outputs_of(theirs, keras_hub_inputs(theirs, ids, mask))
    if spec.task == "encoder":
        np.testing.assert_allclose(ours["sequence_output"], expected["sequence_output"],
                                   atol=1e-4)
        np.testing.assert_allclose(ours["pooled_output"], expected["pooled_output"], atol=1e-4)
    else:
        np.testing.assert_allclose(ours, expected, atol=1e-4)
    if spec.task != "causal_lm":
        return
    # Greedy generation, 20 new tokens, nothing stops it: the same tokens as keras-hub's.
    prompts = np.zeros((2, 25), "int32")
    prompts[:, :5] = ids[:, :5]
    prompt_mask = np.zeros_like(prompts, bool)
    prompt_mask[:, :5] = True
    theirs.compile(sampler="greedy")
    generated = theirs.generate({"token_ids": prompts, "padding_mask": prompt_mask},
                                stop_token_ids=None)
    tokens = decoding.generate(model, ids[:, :5], max_length=25, stop_token_ids=None, pad_id=0,
                               suppressed_ids=())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens),
                                  np.asarray(generated["token_ids"]))


@pytest.mark.parametrize("implementation", ["chunked", "local"])
def test_the_kernel_choice_keeps_the_outputs(implementation):
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("mistral"), dtype="float32")
    model = build_model(spec, weights, implementation=implementation)
    expected = fx.expected("mistral")
    mask = expected["mask"]
    logits = outputs_of(model, model_inputs(spec, expected["ids"], mask))
    assert np.abs(logits[mask] - expected["logits"][mask]).max() < 1e-4
