"""keras_attn.checkpoints: config.json -> ArchitectureSpec, every refusal naming its config key,
and the RoPE inverse frequencies against transformers' own initialisation functions."""

import copy
import inspect

import checkpoint_fixtures as fx
import numpy as np
import pytest

from keras_attn.checkpoints import (
    read_config,
    rope_inverse_frequencies,
    spec_from_hf_config,
)


def config_of(name):
    return copy.deepcopy(read_config(fx.hf_checkpoint(name))[0])


def test_specs_of_the_fixtures():
    llama = spec_from_hf_config(*read_config(fx.hf_checkpoint("llama3")))
    assert (llama.architecture, llama.task, llama.num_heads, llama.num_key_value_heads,
            llama.head_dim, llama.norm, llama.activation, llama.gated_ffn) == (
        "llama", "causal_lm", 4, 2, 4, "rms", "silu", True)
    assert (llama.rope_type, llama.rope_theta, llama.rope_factor,
            llama.rope_original_max_positions) == ("llama3", 500000.0, 8.0, 16)
    assert not llama.tie_word_embeddings and not llama.query_bias and llama.normalize_first
    # generation_config.json's list of stop ids wins over config.json's single id
    config, generation = read_config(fx.hf_checkpoint("llama3"))
    assert llama.eos_token_ids == tuple(generation["eos_token_id"]) != (config["eos_token_id"],)
    assert len(llama.eos_token_ids) == 2 and llama.pad_token_id is None
    qwen = spec_from_hf_config(config_of("qwen2"))
    assert (qwen.query_bias, qwen.key_bias, qwen.value_bias, qwen.output_bias,
            qwen.ffn_bias, qwen.tie_word_embeddings, qwen.sliding_window) == (
        True, True, True, False, False, True, None)
    assert spec_from_hf_config(config_of("mistral")).sliding_window == 3
    gpt2 = spec_from_hf_config(config_of("gpt2"))
    assert (gpt2.position, gpt2.max_sequence_length, gpt2.activation, gpt2.norm, gpt2.layer_norm_epsilon,
            gpt2.intermediate_dim, gpt2.tie_word_embeddings) == (
        "learned", 64, "gelu_tanh", "layer", 1e-5, 64, True)
    bert = spec_from_hf_config(config_of("bert_mlm"))
    assert (bert.task, bert.causal, bert.normalize_first, bert.embedding_norm, bert.final_norm,
            bert.num_segments, bert.activation, bert.head_activation, bert.pooler,
            bert.pad_token_id) == ("masked_lm", False, False, True, False, 2, "gelu", "gelu",
                                   False, 0)
    assert spec_from_hf_config(config_of("bert")).pooler
    assert spec_from_hf_config(config_of("llama_bf16")).dtype == "bfloat16"


def test_transformers_4_spellings_parse_alike():
    new = config_of("llama3")
    old = {key: value for key, value in new.items() if key != "rope_parameters"}
    scaling = dict(new["rope_parameters"])
    old["rope_theta"] = scaling.pop("rope_theta")
    scaling["type"] = scaling.pop("rope_type")
    old.update(rope_scaling=scaling, torch_dtype=old.pop("dtype"), pretraining_tp=1)
    assert spec_from_hf_config(old) == spec_from_hf_config(new)
    plain = {key: value for key, value in config_of("llama").items() if key != "rope_parameters"}
    plain.update(rope_scaling=None, rope_theta=10000.0)
    assert spec_from_hf_config(plain) == spec_from_hf_config(config_of("llama"))


def test_generation_config_takes_precedence():
    config = config_of("llama")
    spec = spec_from_hf_config(config, {"bos_token_id": 5, "eos_token_id": [6, 7],
                                        "pad_token_id": 0})
    assert (spec.bos_token_id, spec.eos_token_ids, spec.pad_token_id) == (5, (6, 7), 0)
    spec = spec_from_hf_config(config, {"eos_token_id": 9})  # the others from config.json
    assert (spec.bos_token_id, spec.eos_token_ids) == (config["bos_token_id"], (9,))


REFUSALS = [
    ("llama", {"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ("llama", {"architectures": None}, "architectures"),
    ("llama", {"model_type": "mistral"}, "model_type"),
    ("llama", {"use_qk_norm": True}, "use_qk_norm"),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 2,
                                   "long_factor": [2.0] * 2,
                                   "original_max_position_embeddings": 16}},
     "rope_parameters.rope_type"),
    ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},  # beside
     "rope_scaling.rope_type"),                                             # rope_parameters
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "beta_fast": "8"}},
     "rope_scaling.beta_fast"),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "truncate": 0}},
     "rope_scaling.truncate"),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 0}},
     "rope_scaling.attention_factor"),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "low_freq_factor": 1.0}},
     "rope_scaling.low_freq_factor"),
    ("llama", {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling.rope_type"),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                   "low_freq_factor": 1.0}}, "rope_parameters.low_freq_factor"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                   "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}},
     "rope_parameters.high_freq_factor"),
    ("llama", {"hidden_act": "gelu_fast"}, "hidden_act"),
    ("llama", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("llama", {"head_dim": 5}, "head_dim"),
    ("llama", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ("llama", {"pruned_heads": {"0": [1]}}, "pruned_heads"),
    ("llama", {"is_encoder_decoder": True}, "is_encoder_decoder"),
    ("llama", {"dtype": "float8_e4m3fn"}, "dtype"),
    ("llama", {"eos_token_id": 100000}, "eos_token_id"),
    ("llama", {"bos_token_id": -1}, "bos_token_id"),
    ("mistral", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1,
               "layer_types": None}, "max_window_layers"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4,
               "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("gpt2", {"scale_attn_weights": False}, "scale_attn_weights"),
    ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
    ("gpt2", {"activation_function": "quick_gelu"}, "activation_function"),
    ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("bert", {"is_decoder": True}, "is_decoder"),
    ("bert_mlm", {"add_cross_attention": True}, "add_cross_attention"),
    ("llama", {"per_layer_config": {"0": {}}}, "per_layer_config"),
    ("llama", {"rope_parameters": None, "rope_scaling": {"type": "linear", "rope_type": "llama3",
                                                          "factor": 2.0}}, "rope_scaling.type"),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 0.5}},
     "rope_parameters.factor"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}},
     "rope_parameters.rope_theta"),
    ("llama", {"rope_parameters": None, "rope_scaling": "linear"}, "rope_scaling"),
    ("llama", {"head_dim": None, "num_attention_heads": 5, "num_key_value_heads": 5},
     "num_attention_heads"),
    ("llama", {"pretraining_tp": 0}, "pretraining_tp"),
    ("llama", {"vocab_size": 0}, "vocab_size"),
    ("llama", {"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ("llama", {"attention_dropout": "high"}, "attention_dropout"),
    ("llama", {"attention_bias": "yes"}, "attention_bias"),
    ("llama", {"dtype": None, "torch_dtype": "int8"}, "torch_dtype"),
    ("mistral", {"sliding_window": 0}, "sliding_window"),
    ("qwen2", {"layer_types": ["full_attention"]}, "layer_types"),
    ("gpt2", {"n_head": 5}, "n_head"),
    ("gpt2", {"reorder_and_upcast_attn": "yes"}, "reorder_and_upcast_attn"),
    ("bert", {"num_attention_heads": 5}, "num_attention_heads"),
    ("bert", {"pad_token_id": 10**6}, "pad_token_id"),
    ("bert", {"type_vocab_size": -1}, "type_vocab_size"),
]


def test_refusals_name_the_config_key():
    # One test over the table (each test item costs a garbage collection in teardown).
    for name, changes, key in REFUSALS:
        config = config_of(name)
        config.update(changes)
        try:
            spec_from_hf_config(config)
        except ValueError as error:
            assert f"config key `{key}`" in str(error), (name, changes, str(error))
        else:
            pytest.fail(f"{name} with {changes} was not refused")


def test_honoured_options():
    config = config_of("gpt2")
    base = spec_from_hf_config(config)
    config.update(reorder_and_upcast_attn=True, n_ctx=1024, summary_type="mean")
    assert spec_from_hf_config(config) == base  # float32 scores either way
    config = config_of("llama")
    config.update(pretraining_tp=4, attention_bias=True, mlp_bias=True, hidden_act="gelu_new",
                  chunk_size_feed_forward=3)
    spec = spec_from_hf_config(config)
    assert (spec.query_bias, spec.output_bias, spec.ffn_bias, spec.activation) == (
        True, True, True, "gelu_tanh")
    qwen = config_of("qwen2")
    qwen.update(use_sliding_window=True, sliding_window=4, max_window_layers=0, layer_types=None)
    assert spec_from_hf_config(qwen).sliding_window == 4  # every layer slides
    qwen.update(max_window_layers=2)
    assert spec_from_hf_config(qwen).sliding_window is None  # no layer does
    bert = config_of("bert")
    bert["position_embedding_type"] = "absolute"
    assert spec_from_hf_config(bert) == spec_from_hf_config(config_of("bert"))


def test_rope_frequencies_equal_transformers():
    cases = fx.rope_cases()  # default, linear, llama3, yarn: computed by transformers
    assert [case["rope"] and case["rope"]["rope_type"] for case in cases] == [
        None, "linear", "llama3", "yarn", "yarn", "yarn"]
    arguments = set(inspect.signature(rope_inverse_frequencies).parameters)
    for case in cases:
        expected = np.asarray(case["inv_freq"])
        spec = spec_from_hf_config(case["config"])
        rope = {key: value for key, value in (case["rope"] or {}).items() if key in arguments}
        if rope.get("rope_type") == "yarn":
            rope.setdefault("original_max_position_embeddings", 131072)  # transformers' default
        for ours in (spec.rope_inverse_frequencies(),
                     rope_inverse_frequencies(128, 500000.0, **rope)):
            assert ours.dtype == np.float32 and ours.shape == (64,)
            np.testing.assert_allclose(ours, expected, rtol=2e-6, err_msg=str(case["rope"]))
        assert spec.rope_attention_scaling == pytest.approx(case["attention_scale"], rel=1e-12)
        if case["rope"] is not None:  # the scaling changes what is compared
            assert not np.allclose(expected, rope_inverse_frequencies(128, 500000.0))
    assert {case["attention_scale"] for case in cases[3:]} != {1.0}  # YaRN's is not 1


def test_rope_scaling_beside_rope_parameters_is_read_as_transformers_5_reads_it():
    # transformers 5: a non-empty `rope_scaling` replaces `rope_parameters` (whose theta goes
    # with it: the top-level `rope_theta`, else 10000); an empty or null one is not read.
    yarn = spec_from_hf_config(config_of("llama_yarn"))
    assert (yarn.rope_type, yarn.rope_theta, yarn.rope_factor, yarn.rope_beta_fast,
            yarn.rope_original_max_positions) == ("yarn", 1000.0, 4.0, 8, 4)
    assert yarn.rope_attention_scaling == pytest.approx(0.1 * np.log(4.0) + 1)
    config = config_of("llama_yarn")
    del config["rope_theta"]
    assert spec_from_hf_config(config).rope_theta == 10000.0
    for empty in ({}, None):
        config["rope_scaling"] = empty
        spec = spec_from_hf_config(config)
        assert (spec.rope_type, spec.rope_theta, spec.rope_attention_scaling) == (
            "default", 500000.0, 1.0)


ROPE_ERRORS = [
    ({"head_dim": 3, "max_wavelength": 1e4}, "head_dim"),
    ({"head_dim": 4, "max_wavelength": 0}, "max_wavelength"),
    ({"head_dim": 4, "max_wavelength": 1e4, "rope_type": "dynamic"}, "rope_type"),
    ({"head_dim": 4, "max_wavelength": 1e4, "rope_type": "yarn"}, "factor"),
    ({"head_dim": 4, "max_wavelength": 1e4, "rope_type": "yarn", "factor": 2.0},
     "original_max_position_embeddings"),
    ({"head_dim": 4, "max_wavelength": 1e4, "rope_type": "yarn", "factor": 2.0,
      "original_max_position_embeddings": 8, "beta_slow": -1.0}, "beta_slow"),
    ({"head_dim": 4, "max_wavelength": 1e4, "rope_type": "linear"}, "factor"),
    ({"head_dim": 4, "max_wavelength": 1e4, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
      "high_freq_factor": 1.0, "original_max_position_embeddings": 8}, "high_freq_factor"),
]


def test_rope_argument_errors():
    for kwargs, name in ROPE_ERRORS:
        with pytest.raises(ValueError, match=f"`{name}`"):
            rope_inverse_frequencies(**kwargs)
