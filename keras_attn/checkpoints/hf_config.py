"""Hugging Face `config.json` (and `generation_config.json`) -> `ArchitectureSpec`.

Every key of the five families' configuration classes (transformers 5: `LlamaConfig`,
`MistralConfig`, `Qwen2Config`, `GPT2Config`, `BertConfig`, and `PreTrainedConfig`'s common
keys) was decided one by one: honoured (it maps onto a spec field, or provably changes nothing
the conversion produces), or refused with a ValueError naming the key and its value. A key this
table does not know is refused too: its meaning cannot be checked, so it is never ignored.

| key | families | decision |
|---|---|---|
| `architectures` | all | exactly one of `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`, `GPT2LMHeadModel`, `BertModel`, `BertForMaskedLM`; else refused |
| `model_type` | all | must be the family of that class; else refused |
| sizes: `vocab_size`, `hidden_size`/`n_embd`, `num_hidden_layers`/`n_layer`, `num_attention_heads`/`n_head`, `intermediate_size`/`n_inner` (None: 4 d) | all | honoured |
| `num_key_value_heads` | llama, mistral, qwen2 | honoured (None: one per query head); must divide the heads |
| `head_dim` | llama, mistral, qwen2 | honoured (None: hidden_size / heads) |
| `hidden_act` / `activation_function` | all | `silu`, `swish`, `gelu`, `gelu_python`, `gelu_new`, `gelu_pytorch_tanh`, `gelu_python_tanh`, `relu` honoured; others (`gelu_fast`, `quick_gelu`, `gelu_10`, `relu6`, …) refused |
| `rms_norm_eps` / `layer_norm_epsilon` / `layer_norm_eps` | all | honoured |
| `max_position_embeddings` / `n_positions` | all | honoured (the learned table's rows; llama3's default pretraining length) |
| `rope_theta`, `rope_scaling`, `rope_parameters` | llama, mistral, qwen2 | read as transformers 5 reads them: a non-empty `rope_scaling` replaces `rope_parameters` (whose `rope_theta` is then not read: the top-level `rope_theta`, else 10000); `rope_type` (or `type`) `default`, `linear`, `llama3`, `yarn` (its frequencies and attention scaling) honoured; any other type (`dynamic`, `longrope`, …: frequencies that change with the sequence length) refused; `partial_rotary_factor` other than 1 refused; a key the type does not use refused |
| `attention_bias` | llama | honoured (biases on q, k, v and o) |
| `mlp_bias` | llama | honoured (biases on gate, up and down) |
| `pretraining_tp` | llama | honoured: a tensor-parallel split of the same products (transformers 5 ignores it too) |
| `sliding_window` | mistral | honoured (every layer) |
| `layer_types` | mistral | honoured when it says what Mistral does anyway (every layer sliding, or every layer full without a window); else refused (transformers' Mistral would ignore it) |
| `use_sliding_window`, `sliding_window`, `max_window_layers`, `layer_types` | qwen2 | honoured when every layer gets the same attention (all full, or all sliding); a mix of sliding and full layers refused (`max_window_layers`, or `layer_types` when given) |
| `attention_dropout`, `resid_pdrop`, `embd_pdrop`, `attn_pdrop`, `hidden_dropout_prob`, `attention_probs_dropout_prob` | all | honoured as dropout rates (training only) |
| `tie_word_embeddings` | all | honoured |
| `scale_attn_weights` | gpt2 | True honoured; False (unscaled scores) refused |
| `scale_attn_by_inverse_layer_idx` | gpt2 | False honoured; True (a per-layer score scale) refused |
| `reorder_and_upcast_attn` | gpt2 | honoured: it only computes the scores in float32 with the scale folded in; keras_attn computes scores and softmax in float32 |
| `add_cross_attention` | gpt2, bert | False honoured; True (cross-attention weights) refused |
| `n_ctx` | gpt2 | a legacy key transformers ignores: ignored |
| `summary_*` | gpt2 | `GPT2DoubleHeadsModel`'s head, absent here: ignored |
| `type_vocab_size` | bert | honoured |
| `position_embedding_type` | bert | `"absolute"` honoured; `relative_key`, `relative_key_query` refused |
| `is_decoder` | bert | False honoured; True (a causal BERT) refused |
| `classifier_dropout` | bert | classification heads only: ignored |
| `chunk_size_feed_forward` | all | honoured: the FFN applied in chunks gives the same numbers |
| `is_encoder_decoder` | all | True refused |
| `pruned_heads` | all | non-empty refused (heads of unequal counts per layer) |
| `quantization_config`, `per_layer_config` | all | refused |
| `dtype` / `torch_dtype` | all | `float32`, `bfloat16`, `float16` honoured (`spec.dtype`); others refused |
| `bos_token_id`, `eos_token_id` (int or list), `pad_token_id` | all | honoured; `generation_config.json`'s values take precedence (as in `generate`); an id outside the vocabulary refused |
| `use_cache`, `initializer_range`, `output_attentions`, `output_hidden_states`, `return_dict`, `torchscript`, `id2label`, `label2id`, `num_labels`, `problem_type`, `tokenizer_class`, `prefix`, `task_specific_params`, `finetuning_task`, `transformers_version`, `_name_or_path`, `gradient_checkpointing`, generation defaults (`max_length`, `do_sample`, `temperature`, …) | all | no effect on weights or outputs: ignored |
| any other key | all | refused |
"""

from __future__ import annotations

from keras_attn.checkpoints.spec import ArchitectureSpec
from keras_attn.ops.rope import yarn_attention_scaling

CLASSES = {
    "LlamaForCausalLM": ("llama", "causal_lm"),
    "MistralForCausalLM": ("mistral", "causal_lm"),
    "Qwen2ForCausalLM": ("qwen2", "causal_lm"),
    "GPT2LMHeadModel": ("gpt2", "causal_lm"),
    "BertModel": ("bert", "encoder"),
    "BertForMaskedLM": ("bert", "masked_lm"),
}
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_python": "gelu",
               "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_python_tanh": "gelu_tanh", "relu": "relu"}
DTYPES = ("float32", "bfloat16", "float16")
# Keys with no effect on the weights or the outputs of the converted model.
IGNORED = {
    "use_cache", "initializer_range", "output_attentions", "output_hidden_states",
    "return_dict", "torchscript", "id2label", "label2id", "num_labels", "problem_type",
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task",
    "transformers_version", "_name_or_path", "gradient_checkpointing", "_attn_implementation",
    "attn_implementation", "_from_model_config", "tf_legacy_loss", "use_bfloat16",
    "sep_token_id", "cls_token_id", "decoder_start_token_id", "tie_encoder_decoder",
    "cross_attention_hidden_size", "chunk_size_feed_forward",
    # generation defaults (transformers moves them to the generation config)
    "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids",
    "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "epsilon_cutoff",
    "eta_cutoff", "exponential_decay_length_penalty", "forced_bos_token_id",
    "forced_eos_token_id", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "num_beam_groups", "num_beams", "num_return_sequences", "output_scores",
    "remove_invalid_values", "repetition_penalty", "return_dict_in_generate",
    "suppress_tokens", "target_lookbehind", "temperature", "top_k", "top_p", "typical_p",
}
ROPE_KEYS = {"rope_theta", "rope_scaling", "rope_parameters"}
# The keys each family reads (beyond IGNORED and the common ones below).
COMMON = {"architectures", "model_type", "dtype", "torch_dtype", "bos_token_id",
          "eos_token_id", "pad_token_id", "tie_word_embeddings", "is_encoder_decoder",
          "pruned_heads", "quantization_config", "per_layer_config", "add_cross_attention",
          "is_decoder"}
LLAMA_LIKE = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
              "max_position_embeddings", "rms_norm_eps", "attention_dropout"} | ROPE_KEYS
FAMILY_KEYS = {
    "llama": LLAMA_LIKE | {"attention_bias", "mlp_bias", "pretraining_tp"},
    "mistral": LLAMA_LIKE | {"sliding_window", "layer_types"},
    "qwen2": LLAMA_LIKE | {"use_sliding_window", "sliding_window", "max_window_layers",
                           "layer_types"},
    "gpt2": {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
             "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop",
             "layer_norm_epsilon", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
             "reorder_and_upcast_attn", "n_ctx", "summary_type", "summary_use_proj",
             "summary_activation", "summary_proj_to_labels", "summary_first_dropout"},
    "bert": {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "position_embedding_type", "classifier_dropout"},
}
ROPE_TYPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings"},
}
# Keys a RoPE type may leave out (transformers' defaults apply).
ROPE_OPTIONAL_KEYS = {"yarn": {"attention_factor", "beta_fast", "beta_slow", "mscale",
                               "mscale_all_dim", "truncate"}}
DEFAULT_ROPE_THETA = 10000.0


def refuse(key: str, value, why: str) -> None:
    """Raise the ValueError of a config option the conversion cannot honour."""
    raise ValueError(f"Cannot convert the checkpoint: config key `{key}`={value!r} is not "
                     f"supported: {why}. Refused rather than approximated.")


def _int(config: dict, key: str, default=None, minimum: int = 1) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        refuse(key, value, f"expected an integer >= {minimum}")
    return value


def _float(config: dict, key: str, default=None) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        refuse(key, value, "expected a number >= 0")
    return float(value)


def _flag(config: dict, key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        refuse(key, value, "expected true or false")
    return value


def _require(config: dict, key: str, allowed, default, why: str):
    value = config.get(key, default)
    if value not in allowed:
        refuse(key, value, why)
    return value


def _check_keys(config: dict, family: str) -> None:
    known = COMMON | IGNORED | FAMILY_KEYS[family]
    for key in sorted(config):
        if key not in known:
            refuse(key, config[key], f"the conversion does not know this {family} option, so "
                   "it cannot check that the converted model computes what it asks for")


def _check_common(config: dict, family: str) -> None:
    if config.get("is_encoder_decoder", False):
        refuse("is_encoder_decoder", config["is_encoder_decoder"],
               "encoder-decoder models are not converted")
    if config.get("pruned_heads"):
        refuse("pruned_heads", config["pruned_heads"],
               "pruned heads leave layers with unequal head counts")
    for key in ("quantization_config", "per_layer_config"):
        if config.get(key) is not None:
            refuse(key, config[key], "quantized or per-layer heterogeneous checkpoints are not "
                   "converted")
    if _flag(config, "add_cross_attention", False):
        refuse("add_cross_attention", True, "cross-attention layers have no input here")
    if family == "bert" and _flag(config, "is_decoder", False):
        refuse("is_decoder", True, "a causal BERT is not one of the converted classes")


def _dtype(config: dict) -> str:
    key = "dtype" if config.get("dtype") is not None else "torch_dtype"
    value = config.get(key) or "float32"
    name = value[len("torch."):] if isinstance(value, str) and value.startswith("torch.") else value
    if name not in DTYPES:
        refuse(key, value, f"expected one of {DTYPES}")
    return name


def _token_ids(config: dict, generation: dict | None, vocab_size: int):
    """bos, eos (tuple) and pad ids: generation_config.json's first, then config.json's."""
    ids = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        source = generation if generation is not None and key in generation else config
        value = source.get(key)
        items = value if key == "eos_token_id" and isinstance(value, list) else (
            [] if value is None else [value])
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < vocab_size:
                refuse(key, value, f"expected an id in [0, vocabulary_size={vocab_size})")
        ids[key] = tuple(items) if key == "eos_token_id" else value
    return ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"]


def _activation(config: dict, key: str, default: str) -> str:
    value = config.get(key, default)
    if value not in ACTIVATIONS:
        refuse(key, value, f"expected one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[value]


def _rope(config: dict) -> dict:
    """The spec's rope_* fields, as transformers 5 reads them: `rope_scaling` (transformers 4's
    key) when it is a non-empty dict, in place of `rope_parameters` (so a `rope_scaling`
    beside `rope_parameters` wins, and `rope_parameters`' keys, its `rope_theta` included, are
    not read); else `rope_parameters`. A `rope_theta` the dict lacks comes from the top-level
    `rope_theta`, else 10000; `original_max_position_embeddings` from
    `max_position_embeddings` (llama3, yarn)."""
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    params = config.get(key)
    if params is None:
        params = {}
    if not isinstance(params, dict):
        refuse(key, params, "expected a dict of RoPE parameters or null")
    params = dict(params)
    theta = params.pop("rope_theta", config.get("rope_theta", DEFAULT_ROPE_THETA))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        refuse(f"{key}.rope_theta" if "rope_theta" in (config.get(key) or {}) else "rope_theta",
               theta, "expected a number > 0")
    rope_type = params.pop("rope_type", params.get("type", "default"))
    if params.get("type", rope_type) != rope_type:
        refuse(f"{key}.type", params["type"], f"it contradicts rope_type={rope_type!r}")
    params.pop("type", None)
    if rope_type not in ROPE_TYPE_KEYS:
        refuse(f"{key}.rope_type", rope_type,
               f"the converted RoPE types are {sorted(ROPE_TYPE_KEYS)} ('dynamic' and "
               "'longrope' change the frequencies with the sequence length)")
    partial = params.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        refuse(f"{key}.partial_rotary_factor", partial, "only fully rotary heads are converted")
    if rope_type in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings",
                          config.get("max_position_embeddings"))
    for name in sorted(params):
        if name not in ROPE_TYPE_KEYS[rope_type] | ROPE_OPTIONAL_KEYS.get(rope_type, set()):
            refuse(f"{key}.{name}", params[name], f"rope_type={rope_type!r} does not use it")
    for name in sorted(ROPE_TYPE_KEYS[rope_type]):
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            refuse(f"{key}.{name}", value, f"rope_type={rope_type!r} needs a number > 0")
    if rope_type != "default" and params["factor"] < 1:
        refuse(f"{key}.factor", params["factor"], "expected a factor >= 1")
    fields = {
        "rope_theta": float(theta), "rope_type": rope_type,
        "rope_factor": float(params["factor"]) if "factor" in params else None,
        "rope_low_freq_factor": params.get("low_freq_factor"),
        "rope_high_freq_factor": params.get("high_freq_factor"),
        "rope_original_max_positions": params.get("original_max_position_embeddings"),
    }
    if rope_type == "yarn":
        fields.update(_yarn(params, key))
    return fields


def _yarn(params: dict, key: str) -> dict:
    """YaRN's optional keys, checked, and the attention scaling they give."""
    for name in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, (int, float)) or value < 0 or (name == "attention_factor" and not value)):
            refuse(f"{key}.{name}", value, "expected a number >= 0 (> 0 for attention_factor) "
                   "or null")
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        refuse(f"{key}.truncate", truncate, "expected true or false")
    return {"rope_beta_fast": params.get("beta_fast"), "rope_beta_slow": params.get("beta_slow"),
            "rope_truncate": truncate,
            "rope_attention_scaling": yarn_attention_scaling(
                params["factor"], params.get("attention_factor"), params.get("mscale"),
                params.get("mscale_all_dim"))}


def _heads(config: dict, hidden: int) -> dict:
    heads = _int(config, "num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else _int(config, "num_key_value_heads")
    if heads % kv_heads:
        refuse("num_key_value_heads", kv_heads,
               f"expected a divisor of num_attention_heads={heads}")
    head_dim = config.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            refuse("num_attention_heads", heads, f"hidden_size={hidden} is not a multiple of it "
                   "and no head_dim is given")
        head_dim = hidden // heads
    else:
        head_dim = _int(config, "head_dim")
    if head_dim % 2:
        refuse("head_dim", head_dim, "rotary heads need an even size")
    return {"num_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}


def _layer_windows(config: dict, family: str, layers: int) -> int | None:
    """The one sliding window of every layer (None: full attention), or a refusal."""
    window = config.get("sliding_window")
    if family == "qwen2" and not _flag(config, "use_sliding_window", False):
        window = None
    if window is not None:
        window = _int(config, "sliding_window")
    types = config.get("layer_types")
    if family == "qwen2" and types is None:
        first_sliding = _int(config, "max_window_layers", 28, minimum=0)
        types = ["sliding_attention" if window is not None and i >= first_sliding
                 else "full_attention" for i in range(layers)]
        key = "max_window_layers"
    else:
        key = "layer_types"
    if types is None:
        return window
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {
            "full_attention", "sliding_attention"}:
        refuse("layer_types", types, f"expected {layers} of 'full_attention' or "
               "'sliding_attention'")
    effective = {window if kind == "sliding_attention" else None for kind in types}
    if family == "mistral" and set(types) != {"sliding_attention" if window else "full_attention"}:
        refuse("layer_types", types, "transformers' Mistral applies sliding_window="
               f"{window!r} to every layer and ignores layer_types: the checkpoint is meant for "
               "another class")
    if len(effective) > 1:
        refuse(key, config.get(key), "it mixes sliding-window and full-attention layers; "
               "every converted layer attends alike")
    return effective.pop()


def _family(config: dict) -> tuple[str, str, str]:
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or len(architectures) != 1 or (
            architectures[0] not in CLASSES):
        refuse("architectures", architectures, f"expected one of {sorted(CLASSES)}")
    source = architectures[0]
    family, task = CLASSES[source]
    if config.get("model_type", family) != family:
        refuse("model_type", config["model_type"], f"{source} is model_type {family!r}")
    return source, family, task


def spec_from_hf_config(config: dict, generation_config: dict | None = None
                        ) -> ArchitectureSpec:
    """The architecture a Hugging Face `config.json` describes, or a refusal.

    Args:
        config: dict, the parsed `config.json`.
        generation_config: dict or None, the parsed `generation_config.json`; its
            `bos_token_id`, `eos_token_id` and `pad_token_id` take precedence. Defaults to
            `None`.

    Returns:
        `ArchitectureSpec`.

    Raises:
        ValueError: naming the config key and its value, for anything the conversion cannot
            honour (see this module's table).

    Example:
    >>> config, generation = read_config("path/to/llama")
    >>> spec = spec_from_hf_config(config, generation)
    >>> spec.num_key_value_heads, spec.rope_type  # (8, 'llama3')
    """
    if not isinstance(config, dict):
        _check_config_type(config)
    source, family, task = _family(config)
    _check_keys(config, family)
    _check_common(config, family)
    if family == "gpt2":
        fields = _gpt2(config)
    elif family == "bert":
        fields = _bert(config, task)
    else:
        fields = _llama_like(config, family)
    vocab = fields["vocabulary_size"]
    bos, eos, pad = _token_ids(config, generation_config, vocab)
    return ArchitectureSpec(
        architecture=family, task=task, source=source, dtype=_dtype(config),
        tie_word_embeddings=_flag(config, "tie_word_embeddings", family in ("gpt2", "bert")),
        bos_token_id=bos, eos_token_ids=eos, pad_token_id=pad, **fields)


def _check_config_type(config) -> None:
    raise ValueError("Received an invalid value for argument `config`, expected the dict of a "
                     f"config.json. Received: config={type(config).__name__}")


def _llama_like(config: dict, family: str) -> dict:
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    attention_bias = family == "llama" and _flag(config, "attention_bias", False)
    if family == "llama":
        _int(config, "pretraining_tp", 1)
    return dict(
        vocabulary_size=_int(config, "vocab_size"), hidden_dim=hidden, num_layers=layers,
        intermediate_dim=_int(config, "intermediate_size"), causal=True, norm="rms",
        layer_norm_epsilon=_float(config, "rms_norm_eps", 1e-6), normalize_first=True,
        activation=_activation(config, "hidden_act", "silu"), gated_ffn=True,
        query_bias=attention_bias or family == "qwen2",
        key_bias=attention_bias or family == "qwen2",
        value_bias=attention_bias or family == "qwen2", output_bias=attention_bias,
        ffn_bias=family == "llama" and _flag(config, "mlp_bias", False),
        position="rope", max_sequence_length=_int(config, "max_position_embeddings", 2048),
        sliding_window=_layer_windows(config, family, layers),
        attention_dropout=_float(config, "attention_dropout", 0.0),
        **_heads(config, hidden), **_rope(config))


def _gpt2(config: dict) -> dict:
    _require(config, "scale_attn_weights", (True,), True,
             "unscaled attention scores have no equivalent")
    _require(config, "scale_attn_by_inverse_layer_idx", (False,), False,
             "a score scale of 1 / (layer + 1) per layer has no equivalent")
    _flag(config, "reorder_and_upcast_attn", False)
    hidden = _int(config, "n_embd", 768)
    heads = _int(config, "n_head", 12)
    if hidden % heads:
        refuse("n_head", heads, f"n_embd={hidden} is not a multiple of it")
    inner = config.get("n_inner")
    return {
        "vocabulary_size": _int(config, "vocab_size", 50257), "hidden_dim": hidden,
        "num_layers": _int(config, "n_layer", 12), "num_heads": heads, "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_dim": 4 * hidden if inner is None else _int(config, "n_inner"),
        "causal": True, "norm": "layer",
        "layer_norm_epsilon": _float(config, "layer_norm_epsilon", 1e-5),
        "normalize_first": True,
        "activation": _activation(config, "activation_function", "gelu_new"),
        "gated_ffn": False, "query_bias": True, "key_bias": True, "value_bias": True,
        "output_bias": True, "ffn_bias": True, "position": "learned",
        "max_sequence_length": _int(config, "n_positions", 1024),
        "dropout": _float(config, "resid_pdrop", 0.1),
        "attention_dropout": _float(config, "attn_pdrop", 0.1),
        "embedding_dropout": _float(config, "embd_pdrop", 0.1)}


def _bert(config: dict, task: str) -> dict:
    _require(config, "position_embedding_type", ("absolute",), "absolute",
             "only absolute (learned) position embeddings are converted")
    hidden = _int(config, "hidden_size", 768)
    heads = _int(config, "num_attention_heads", 12)
    if hidden % heads:
        refuse("num_attention_heads", heads, f"hidden_size={hidden} is not a multiple of it")
    activation = _activation(config, "hidden_act", "gelu")
    dropout = _float(config, "hidden_dropout_prob", 0.1)
    return {
        "vocabulary_size": _int(config, "vocab_size", 30522), "hidden_dim": hidden,
        "num_layers": _int(config, "num_hidden_layers", 12), "num_heads": heads,
        "num_key_value_heads": heads, "head_dim": hidden // heads,
        "intermediate_dim": _int(config, "intermediate_size", 3072), "causal": False,
        "norm": "layer", "layer_norm_epsilon": _float(config, "layer_norm_eps", 1e-12),
        "normalize_first": False,
        "activation": activation, "gated_ffn": False, "query_bias": True, "key_bias": True,
        "value_bias": True, "output_bias": True, "ffn_bias": True, "position": "learned",
        "max_sequence_length": _int(config, "max_position_embeddings", 512),
        "num_segments": _int(config, "type_vocab_size", 2, minimum=0),
        "embedding_norm": True, "final_norm": False,
        "head_activation": activation if task == "masked_lm" else None,
        "head_layer_norm_epsilon": (_float(config, "layer_norm_eps", 1e-12)
                                    if task == "masked_lm" else None),
        "pooler": task == "encoder", "dropout": dropout, "embedding_dropout": dropout,
        "attention_dropout": _float(config, "attention_probs_dropout_prob", 0.1)}
