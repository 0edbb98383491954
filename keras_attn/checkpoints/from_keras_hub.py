"""keras-hub backbones and tasks in memory -> `ArchitectureSpec` and the canonical weights.

Reads `GPT2Backbone`, `LlamaBackbone` (and `Llama3Backbone`), `MistralBackbone` and
`BertBackbone`, alone or inside their `GPT2CausalLM`, `LlamaCausalLM`, `MistralCausalLM` and
`BertMaskedLM` tasks, through public Keras API only: the backbone's `get_config()` and its
variables' `path`s (e.g. `transformer_layer_0/self_attention/query/kernel`). keras-hub keeps
heads on their own axis (`(D, H, d)` query kernels, `(H, d, D)` output kernels); they are
flattened head-major, which is the canonical layout. keras-hub is not imported.

What keras-hub computes differently from the Hugging Face checkpoints it converts is kept, not
smoothed over: its BERT uses the tanh GELU in the encoder blocks (`activation="gelu_tanh"`) and
an epsilon of 1e-5 in the MLM head's norm (`head_norm_eps`); a backbone alone is read with the
head its tasks use (decoders: logits through the token embedding; BERT: the pooler, no MLM
head). LoRA and quantized variables are refused (merge or dequantize first).
"""

from __future__ import annotations

import re

import keras
import numpy as np

from keras_attn.checkpoints.canonical import canonical_shapes, check_canonical
from keras_attn.checkpoints.spec import ArchitectureSpec

BACKBONES = {"GPT2Backbone": "gpt2", "LlamaBackbone": "llama", "MistralBackbone": "mistral",
             "BertBackbone": "bert"}
# variable path (fullmatch) -> canonical key; `{i}` is the layer index.
RENAMES = (
    (r"transformer_layer_(\d+)/self_attention(?:_layer)?/(query|key|value)/(kernel|bias)",
     r"layers/\1/attention/\2/\3"),
    (r"transformer_layer_(\d+)/self_attention(?:_layer)?/attention_output/(kernel|bias)",
     r"layers/\1/attention/output/\2"),
    (r"transformer_layer_(\d+)/self_attention_layer_?norm/(scale|gamma|beta)",
     r"layers/\1/attention_norm/\2"),
    (r"transformer_layer_(\d+)/feedforward_layer_?norm/(scale|gamma|beta)",
     r"layers/\1/ffn_norm/\2"),
    (r"transformer_layer_(\d+)/feedforward_gate_dense/(kernel|bias)", r"layers/\1/ffn/gate/\2"),
    (r"transformer_layer_(\d+)/feedforward_intermediate_dense/(kernel|bias)",
     r"layers/\1/ffn/hidden/\2"),
    (r"transformer_layer_(\d+)/feedforward_output_dense/(kernel|bias)",
     r"layers/\1/ffn/output/\2"),
    (r"token_embedding/embeddings", r"token_embedding/embeddings"),
    (r"token_embedding/reverse_embeddings", r"lm_head/kernel"),
    (r"position_embedding/embeddings", r"position_embedding/embeddings"),
    (r"segment_embedding/embeddings", r"token_type_embedding/embeddings"),
    (r"embeddings_layer_norm/(gamma|beta)", r"embedding_norm/\1"),
    (r"(?:layer_norm|sequence_output_layernorm)/(scale|gamma|beta)", r"final_norm/\1"),
    (r"pooled_dense/(kernel|bias)", r"pooler/\1"),
    (r"mlm_head/intermediate_dense/(kernel|bias)", r"mlm_head/dense/\1"),
    (r"mlm_head/intermediate_layer_norm/(gamma|beta)", r"mlm_head/norm/\1"),
    (r"mlm_head/output_bias", r"mlm_head/bias"),
)
LEAVES = {"gamma": "scale", "beta": "offset"}


def _parts(model):
    """(backbone, family) of a keras-hub backbone or task."""
    backbone = getattr(model, "backbone", model)
    for cls in type(backbone).__mro__:
        if cls.__name__ in BACKBONES:
            return backbone, BACKBONES[cls.__name__]
    raise ValueError(
        "Received an invalid value for argument `model`, expected a keras-hub "
        f"{', '.join(sorted(BACKBONES))} or a task holding one (GPT2CausalLM, LlamaCausalLM, "
        f"MistralCausalLM, BertMaskedLM). Received: model={type(model).__name__}")


def _variables(model) -> dict[str, object]:
    variables = {}
    for variable in model.weights:
        if variable.path in variables and variables[variable.path] is not variable:
            raise ValueError(f"Two variables share the path {variable.path!r}.")
        variables[variable.path] = variable
    return variables


def _rename(path: str) -> str | None:
    for pattern, replacement in RENAMES:
        if re.fullmatch(pattern, path):
            owner, _, leaf = re.sub(pattern, replacement, path).rpartition("/")
            return f"{owner}/{LEAVES.get(leaf, leaf)}"
    return None


def _token_ids(model) -> dict:
    tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    ids = {name: getattr(tokenizer, name, None)
           for name in ("start_token_id", "end_token_id", "pad_token_id")}
    end = ids["end_token_id"]
    return {"bos_token_id": ids["start_token_id"], "pad_token_id": ids["pad_token_id"],
            "eos_token_ids": () if end is None else (int(end),)}


def _rope(config: dict, family: str) -> dict:
    theta = float(config["rope_max_wavelength"])
    linear = config.get("rope_position_scaling_factor", config.get("rope_scaling_factor", 1.0))
    llama3 = config.get("rope_frequency_adjustment_factor")
    if llama3 is not None:
        if linear != 1.0:
            raise ValueError(
                "Cannot convert the backbone: rope_position_scaling_factor="
                f"{linear!r} together with rope_frequency_adjustment_factor={llama3!r} has no "
                "Hugging Face equivalent. Refused rather than approximated.")
        return {"rope_theta": theta, "rope_type": "llama3", "rope_factor": float(llama3),
                "rope_low_freq_factor": config["rope_low_freq_factor"],
                "rope_high_freq_factor": config["rope_high_freq_factor"],
                "rope_original_max_positions": config["rope_pretraining_sequence_length"]}
    if linear != 1.0:
        return {"rope_theta": theta, "rope_type": "linear", "rope_factor": float(linear)}
    return {"rope_theta": theta, "rope_type": "default"}


def spec_from_keras_hub(model) -> ArchitectureSpec:
    """The architecture of a keras-hub backbone or task, in keras_attn's terms.

    Args:
        model: a keras-hub `GPT2Backbone`, `LlamaBackbone`, `MistralBackbone` or
            `BertBackbone`, or a task holding one (`GPT2CausalLM`, `LlamaCausalLM`,
            `MistralCausalLM`, `BertMaskedLM`). Special token ids come from the task's
            preprocessor's tokenizer when it has one.

    Returns:
        `ArchitectureSpec` (`source` is e.g. `"keras_hub.LlamaCausalLM"`).

    Raises:
        ValueError: another model, or a RoPE setting with no Hugging Face equivalent.
    """
    backbone, family = _parts(model)
    config = backbone.get_config()
    variables = _variables(backbone)
    hidden = config["hidden_dim"]
    embedding = variables["token_embedding/embeddings"]
    common = dict(
        architecture=family, source=f"keras_hub.{type(model).__name__}",
        vocabulary_size=config["vocabulary_size"], hidden_dim=hidden,
        num_layers=config["num_layers"], intermediate_dim=config["intermediate_dim"],
        dtype=str(embedding.dtype), dropout=float(config["dropout"]),
        attention_dropout=float(config["dropout"]), **_token_ids(model))
    if family in ("llama", "mistral"):
        heads = config["num_query_heads"]
        head_dim = config.get("head_dim") or hidden // heads
        return ArchitectureSpec(
            task="causal_lm", num_heads=heads, num_key_value_heads=config["num_key_value_heads"],
            head_dim=head_dim, causal=True, norm="rms",
            layer_norm_epsilon=config["layer_norm_epsilon"],
            normalize_first=True, activation="silu", gated_ffn=True, query_bias=False,
            key_bias=False, value_bias=False, output_bias=False, ffn_bias=False,
            position="rope", max_sequence_length=None, sliding_window=config.get("sliding_window"),
            tie_word_embeddings="token_embedding/reverse_embeddings" not in variables,
            **_rope(config, family), **common)
    heads = config["num_heads"]
    shared = {"num_heads": heads, "num_key_value_heads": heads, "head_dim": hidden // heads,
              "norm": "layer", "gated_ffn": False, "query_bias": True, "key_bias": True,
              "value_bias": True, "output_bias": True, "ffn_bias": True, "position": "learned",
              "max_sequence_length": config["max_sequence_length"], "tie_word_embeddings": True,
              "activation": "gelu_tanh", "embedding_dropout": float(config["dropout"])}
    if family == "gpt2":
        return ArchitectureSpec(task="causal_lm", causal=True, layer_norm_epsilon=1e-5,
                                normalize_first=True,
                                **shared, **common)
    masked = "mlm_head/output_bias" in _variables(model)
    return ArchitectureSpec(
        task="masked_lm" if masked else "encoder", causal=False, layer_norm_epsilon=1e-12,
        normalize_first=False, num_segments=config["num_segments"], embedding_norm=True,
        final_norm=False, pooler=True, head_activation="gelu" if masked else None,
        head_layer_norm_epsilon=1e-5 if masked else None, **shared, **common)


def canonical_from_keras_hub(model) -> dict[str, np.ndarray]:
    """The canonical weights (see `keras_attn.checkpoints.canonical`) of a keras-hub model.

    Args:
        model: a keras-hub backbone or task, as for `spec_from_keras_hub`.

    Returns:
        dict from canonical key to NumPy array (copies of the variables' values), in the
        order of `canonical_shapes`.

    Raises:
        ValueError: a variable the conversion does not know (LoRA, quantization scales), or
            weights that do not fit the spec.
    """
    spec = spec_from_keras_hub(model)
    expected = canonical_shapes(spec)
    weights, unknown = {}, []
    for path, variable in _variables(model).items():
        key = _rename(path)
        if key is None:
            unknown.append(path)
            continue
        value = keras.ops.convert_to_numpy(variable)
        weights[key] = value.reshape(expected[key]) if key in expected else value
    if unknown:
        raise ValueError(f"The {spec.source} model has variables the conversion does not know "
                         f"(LoRA or quantization variables: merge or dequantize first): "
                         f"{unknown[:8]}")
    check_canonical(weights, spec)
    return {key: weights[key] for key in expected}  # in model order
