"""keras_attn.checkpoints: the canonical weights from Hugging Face state dicts and from keras-hub
models mean what `canonical`'s table says: the NumPy forward pass written from that table
(`reference.pretrained_transformer`) reproduces torch's logits and keras-hub's outputs, and
keras-hub's own importer lands on the same arrays as ours."""

import checkpoint_fixtures as fx
import keras
import numpy as np
import pytest
import reference as ref

from keras_attn.checkpoints import (
    canonical_from_hf_state_dict,
    canonical_from_keras_hub,
    canonical_shapes,
    load_hf_checkpoint,
    read_config,
    read_safetensors,
    spec_from_hf_config,
    spec_from_keras_hub,
)

# Options each fixture exists to exercise, and the spec without them (which must then
# disagree with torch, so that agreeing proves the option is honoured).
WITHOUT = {
    "llama3": {"rope_type": "default", "rope_factor": None},
    "llama_linear": {"rope_type": "default", "rope_factor": None},
    "mistral": {"sliding_window": None},
    "qwen2_sliding": {"sliding_window": None},
    "llama_biases": {"activation": "silu"},
}


def reference_outputs(spec, weights, expected):
    kwargs = {"token_type_ids": expected["token_type_ids"]} if spec.architecture == "bert" else {}
    return ref.pretrained_transformer(spec, weights, expected["ids"],
                                      padding_mask=expected["mask"], **kwargs)


def test_canonical_weights_reproduce_torch():
    for name in fx.CHECKPOINTS:
        spec, weights = load_hf_checkpoint(fx.hf_checkpoint(name), dtype="float32")
        assert list(weights) == list(canonical_shapes(spec)), name
        expected = fx.expected(name)
        mask = expected["mask"]  # padded positions of the second row are not compared
        ours = reference_outputs(spec, weights, expected)
        if spec.task == "encoder":
            np.testing.assert_allclose(ours[0][mask], expected["hidden"][mask], atol=1e-5,
                                       err_msg=name)
            np.testing.assert_allclose(ours[1], expected["pooled"], atol=1e-5, err_msg=name)
            continue
        if spec.task == "causal_lm":  # the greedy continuation, from the table's formulas
            tokens = expected["ids"][:, :5]
            for _ in range(20):
                logits = ref.pretrained_transformer(spec, weights, tokens)[:, -1]
                tokens = np.concatenate([tokens, logits.argmax(-1)[:, None]], axis=1)
            np.testing.assert_array_equal(tokens, expected["generated"], err_msg=name)
        error = np.abs(ours[mask] - expected["logits"][mask]).max()
        assert error < 1e-5, (name, error)
        if name in WITHOUT:  # (random weights give small logits: compare to our error)
            other = reference_outputs(spec.replace(**WITHOUT[name]), weights, expected)
            other_error = np.abs(other[mask] - expected["logits"][mask]).max()
            assert other_error > max(1e-4, 100 * error), (name, other_error, error)


def test_dtypes_and_layouts():
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama_bf16"))
    assert spec.dtype == "bfloat16" and weights["layers/0/ffn/gate/kernel"].dtype.name == (
        "bfloat16")
    state = read_safetensors(fx.hf_checkpoint("llama"))
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama"))
    assert spec.dtype == "float32"
    np.testing.assert_array_equal(weights["layers/1/attention/key/kernel"],
                                  state["model.layers.1.self_attn.k_proj.weight"].T)
    np.testing.assert_array_equal(weights["lm_head/kernel"], state["lm_head.weight"].T)
    state = read_safetensors(fx.hf_checkpoint("gpt2"))
    weights = load_hf_checkpoint(fx.hf_checkpoint("gpt2"))[1]
    fused = state["transformer.h.0.attn.c_attn.weight"]  # Conv1D: (in, 3 out), no transpose
    for i, part in enumerate(("query", "key", "value")):
        np.testing.assert_array_equal(weights[f"layers/0/attention/{part}/kernel"],
                                      fused[:, 16 * i:16 * (i + 1)])
    assert "lm_head/kernel" not in weights  # tied: the logits use the token embedding


def renamed(state, rename):
    return {rename(key): value for key, value in state.items()}


def test_older_names_and_buffers_are_accepted():
    bert = read_safetensors(fx.hf_checkpoint("bert_mlm"))
    spec = spec_from_hf_config(*read_config(fx.hf_checkpoint("bert_mlm")))
    old = renamed(bert, lambda key: key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
        "LayerNorm.bias", "LayerNorm.beta"))
    old.update({"bert.embeddings.position_ids": np.arange(64)[None],
                "cls.seq_relationship.weight": np.zeros((2, 16), np.float32),
                "cls.predictions.decoder.weight": bert["bert.embeddings.word_embeddings.weight"],
                "cls.predictions.decoder.bias": bert["cls.predictions.bias"]})
    ours = canonical_from_hf_state_dict(old, spec)
    for key, value in canonical_from_hf_state_dict(bert, spec).items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    gpt2 = read_safetensors(fx.hf_checkpoint("gpt2"))
    spec = spec_from_hf_config(*read_config(fx.hf_checkpoint("gpt2")))
    old = renamed(gpt2, lambda key: key.removeprefix("transformer."))  # the original upload
    old["h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), bool))  # causal-mask buffers
    old["h.1.attn.masked_bias"] = np.float32(-1e4)
    assert canonical_from_hf_state_dict(old, spec).keys() == (
        canonical_from_hf_state_dict(gpt2, spec).keys())


def test_weights_that_would_be_lost_or_are_missing_are_refused():
    path = fx.hf_checkpoint("qwen2")
    state, spec = read_safetensors(path), spec_from_hf_config(*read_config(path))
    with pytest.raises(ValueError, match="model.layers.0.self_attn.q_norm.weight"):
        canonical_from_hf_state_dict({**state, "model.layers.0.self_attn.q_norm.weight":
                                      np.ones(4, np.float32)}, spec)
    incomplete = dict(state)
    del incomplete["model.layers.1.self_attn.k_proj.bias"]
    with pytest.raises(ValueError, match="layers/1/attention/key/bias"):
        canonical_from_hf_state_dict(incomplete, spec)
    untied = {**state, "lm_head.weight": np.zeros_like(state["model.embed_tokens.weight"])}
    with pytest.raises(ValueError, match="`tie_word_embeddings`"):
        canonical_from_hf_state_dict(untied, spec)
    with pytest.raises(ValueError, match="token embedding"):
        canonical_from_hf_state_dict({}, spec)


SAME_FIELDS = ("vocabulary_size", "hidden_dim", "num_layers", "num_heads",
               "num_key_value_heads", "head_dim", "intermediate_dim", "causal", "norm",
               "layer_norm_epsilon", "normalize_first", "gated_ffn", "query_bias", "key_bias",
               "value_bias", "output_bias", "ffn_bias", "position", "tie_word_embeddings",
               "sliding_window", "rope_theta", "rope_type", "num_segments", "embedding_norm",
               "final_norm")


def test_keras_hub_importer_lands_on_our_weights():
    import keras_hub

    for name in ("llama", "mistral", "gpt2", "bert"):
        backbone = keras_hub.models.Backbone.from_preset(fx.hf_checkpoint(name))
        hf_spec, hf_weights = load_hf_checkpoint(fx.hf_checkpoint(name))
        kh_spec, kh_weights = spec_from_keras_hub(backbone), canonical_from_keras_hub(backbone)
        assert kh_weights.keys() == hf_weights.keys(), name
        for key, value in hf_weights.items():
            if name == "mistral":  # keras-hub's Mistral importer rounds through float16
                value = value.astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(kh_weights[key], value, err_msg=f"{name} {key}")
        for field in SAME_FIELDS:
            assert getattr(kh_spec, field) == getattr(hf_spec, field), (name, field)


def keras_hub_outputs(model, ids):
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}
    if hasattr(model, "backbone") and "segment_ids" in model.backbone.input:
        inputs.update(segment_ids=np.zeros_like(ids), mask_positions=np.arange(7)[None])
        inputs["mask_positions"] = np.repeat(inputs["mask_positions"], len(ids), axis=0)
    elif "segment_ids" in model.input:
        inputs["segment_ids"] = np.zeros_like(ids)
    return keras.tree.map_structure(keras.ops.convert_to_numpy, model(inputs))


def test_keras_hub_weights_reproduce_keras_hub():
    for name in ("gpt2", "llama", "llama3", "mistral", "bert", "bert_mlm"):
        model = fx.keras_hub_model(name)
        spec, weights = spec_from_keras_hub(model), canonical_from_keras_hub(model)
        assert list(weights) == list(canonical_shapes(spec)), name
        ids = np.random.default_rng(1).integers(0, spec.vocabulary_size, size=(2, 7))
        ours = ref.pretrained_transformer(spec, weights, ids)
        theirs = keras_hub_outputs(model, ids)
        if spec.task == "encoder":
            np.testing.assert_allclose(ours[0], theirs["sequence_output"], atol=1e-5,
                                       err_msg=name)
            np.testing.assert_allclose(ours[1], theirs["pooled_output"], atol=1e-5, err_msg=name)
        else:
            np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=name)


def test_keras_hub_specs_say_what_keras_hub_computes():
    llama3 = spec_from_keras_hub(fx.keras_hub_model("llama3"))
    assert (llama3.rope_type, llama3.rope_factor, llama3.rope_original_max_positions) == (
        "llama3", 8.0, 16)
    bert = spec_from_keras_hub(fx.keras_hub_model("bert_mlm"))
    assert (bert.task, bert.activation, bert.head_activation, bert.head_layer_norm_epsilon) == (
        "masked_lm", "gelu_tanh", "gelu", 1e-5)  # keras-hub's BERT, not Hugging Face's
    gpt2 = spec_from_keras_hub(fx.keras_hub_model("gpt2"))
    assert (gpt2.task, gpt2.tie_word_embeddings, gpt2.activation) == (
        "causal_lm", True, "gelu_tanh")
    assert not spec_from_keras_hub(fx.keras_hub_model("llama")).tie_word_embeddings


def test_keras_hub_refusals():
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=16, num_layers=1,
                                              num_query_heads=2, num_key_value_heads=1,
                                              hidden_dim=8, intermediate_dim=16)
    backbone.enable_lora(2)
    with pytest.raises(ValueError, match="lora"):
        canonical_from_keras_hub(backbone)
    with pytest.raises(ValueError, match="`model`"):
        spec_from_keras_hub(keras.Sequential([keras.layers.Dense(2)]))
    both = keras_hub.models.LlamaBackbone(
        vocabulary_size=16, num_layers=1, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=8, intermediate_dim=16, rope_position_scaling_factor=2.0,
        rope_frequency_adjustment_factor=8.0, rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0, rope_pretraining_sequence_length=16)
    with pytest.raises(ValueError, match="rope_position_scaling_factor"):
        spec_from_keras_hub(both)  # linear and llama3 scaling at once: no HF equivalent
