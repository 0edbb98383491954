"""Pretrained weights into a keras_attn model: `build_model(spec, weights)` assembles the
model an `ArchitectureSpec` describes from keras_attn's one assembly (`TransformerDecoderOnly`
for Llama, Mistral, Qwen2 and GPT-2; `TransformerEncoder` with BERT's embedding and MLM head),
then sets the canonical weights on it.

What the spec says and where it goes:

| spec | keras_attn |
|---|---|
| `num_heads`, `num_kv_heads`, `head_dim`, `{query,key,value,output}_bias`, `sliding_window` | the blocks' `AttentionConfig` (`attention_config`) |
| `position="rope"` | a `FrequencyRotaryEmbedding` with `spec.rope_inverse_frequencies()` and `spec.rope_attention_scaling`, the configuration's `position_encoding` |
| `position="learned"` | the stack's `position_embedding="learned"`, `max_sequence_length=max_positions` |
| `intermediate_size`, `activation`, `gated_ffn`, `ffn_bias`, `norm`, `norm_eps`, `norm_first`, `dropout` | the stack's `BlockConfig` (`block_config`; a gated activation by its name, `"swiglu"`) |
| `tie_word_embeddings` | `tie_word_embeddings` (the head projects with the token table) |
| BERT's segments, embedding norm, MLM head, pooler | `TokenEmbedding(num_segments, norm)`, `OutputHead(transform_activation)`, a `Dense` (tanh) on the first position |

Padding is never a token id here (`pad_id=None`: Llama's id 0 is a real token): the models
take an explicit `padding_mask`.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_one_of
from keras_attn.checkpoints.canonical import check_canonical, check_spec
from keras_attn.checkpoints.spec import ArchitectureSpec
from keras_attn.layers import legacy
from keras_attn.layers.activations import gated_name
from keras_attn.layers.config import AttentionConfig, BlockConfig
from keras_attn.layers.embedding import OutputHead, TokenEmbedding
from keras_attn.layers.rotary_frequencies import FrequencyRotaryEmbedding
from keras_attn.models.decoder_only import TransformerDecoderOnly
from keras_attn.models.transformer import TransformerEncoder

DTYPES = ("float32", "bfloat16", "float16")
# The attention options a user chooses for a checkpoint (the rest is the checkpoint's).
KERNEL_OPTIONS = ("implementation", "chunk_size", "flash_attention")


def attention_config(spec: ArchitectureSpec, **kernel) -> AttentionConfig:
    """The `AttentionConfig` of `spec`'s self-attention, with the `kernel` options a user
    chose (`implementation`, `chunk_size`, `flash_attention`)."""
    use_bias = tuple(name for name in ("query", "key", "value", "output")
                     if getattr(spec, f"{name}_bias"))
    position = None
    if spec.position == "rope":
        position = FrequencyRotaryEmbedding(
            [float(f) for f in spec.rope_inverse_frequencies()], name="rotary_embedding",
            attention_scaling=spec.rope_attention_scaling)
    return AttentionConfig(
        num_heads=spec.num_heads, num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim, use_bias=use_bias or False, position_encoding=position,
        sliding_window=spec.sliding_window, **kernel)


def block_config(spec: ArchitectureSpec, **kernel) -> BlockConfig:
    """The `BlockConfig` of `spec`'s blocks (`attention_config` for the attention)."""
    activation = _activation(spec.activation)
    if spec.gated_ffn:
        activation = gated_name(spec.activation)
    return BlockConfig(
        attention=attention_config(spec, **kernel), intermediate_dim=spec.intermediate_dim,
        activation=activation, use_bias=spec.ffn_bias, normalize_first=spec.normalize_first,
        norm=spec.norm, layer_norm_epsilon=spec.layer_norm_epsilon, dropout=spec.dropout)


def _decoder(spec: ArchitectureSpec, dtype: str, kernel: dict, max_sequence_length):
    if spec.position == "learned":
        if max_sequence_length is not None and max_sequence_length > spec.max_sequence_length:
            raise ValueError(
                "Argument `max_sequence_length` must be at most the checkpoint's "
                f"{spec.max_sequence_length} learned positions. Received: "
                f"max_sequence_length={max_sequence_length}")
        max_sequence_length = spec.max_sequence_length
    return TransformerDecoderOnly(
        spec.vocabulary_size, spec.num_layers, spec.hidden_dim, block_config(spec, **kernel),
        position_embedding="learned" if spec.position == "learned" else None,
        max_sequence_length=max_sequence_length,
        tie_word_embeddings=spec.tie_word_embeddings, pad_id=None, name="decoder",
        dtype=dtype)


def _encoder(spec: ArchitectureSpec, dtype: str, kernel: dict):
    embedding = TokenEmbedding(
        spec.vocabulary_size, spec.hidden_dim, position="learned",
        max_sequence_length=spec.max_sequence_length, num_segments=spec.num_segments or None,
        norm=spec.norm if spec.embedding_norm else None, layer_norm_epsilon=spec.layer_norm_epsilon,
        dropout=spec.embedding_dropout, name="embedding", dtype=dtype)
    head = None
    if spec.task == "masked_lm":
        head = OutputHead(spec.vocabulary_size, tie_word_embeddings=spec.tie_word_embeddings,
                          use_bias=True, transform_activation=_activation(spec.head_activation),
                          layer_norm_epsilon=spec.head_layer_norm_epsilon, name="head", dtype=dtype)
    return TransformerEncoder(
        spec.vocabulary_size, spec.num_layers, spec.hidden_dim, block_config(spec, **kernel),
        pad_id=None, embedding=embedding, head=head, name="encoder", dtype=dtype)


def _activation(name: str):
    # The spec's names (`spec.ACTIVATIONS`) as keras_attn's blocks and heads take them.
    if name == "gelu":  # the exact (erf) GELU: Keras' default
        return keras.activations.gelu
    return name


def _check_supported(spec: ArchitectureSpec) -> None:
    """What the assembly cannot express, refused with the spec field that asks for it."""
    if spec.attention_dropout != spec.dropout:
        raise ValueError(
            f"Cannot build the {spec.source} spec: keras_attn's blocks have one dropout rate "
            "for attention weights and residual branches. Received: "
            f"attention_dropout={spec.attention_dropout}, dropout={spec.dropout} (e.g. "
            "`spec.replace(attention_dropout=spec.dropout)` to train with one rate)")
    if spec.architecture == "bert":
        if spec.causal or spec.normalize_first or spec.position != "learned" or spec.gated_ffn:
            raise ValueError(
                f"Cannot build the {spec.source} spec: a BERT encoder is bidirectional, "
                "post-norm, with learned positions and a plain FFN. Received: "
                f"causal={spec.causal}, norm_first={spec.normalize_first}, "
                f"position={spec.position!r}, gated_ffn={spec.gated_ffn}")
        if spec.head_dim * spec.num_heads != spec.hidden_dim or (
                spec.num_key_value_heads != spec.num_heads):
            raise ValueError(
                f"Cannot build the {spec.source} spec: the encoder's heads split hidden_size "
                f"evenly, without grouped-query attention. Received: head_dim={spec.head_dim}"
                f", num_heads={spec.num_heads}, num_kv_heads={spec.num_key_value_heads}")
        if not (spec.query_bias and spec.key_bias and spec.value_bias and spec.output_bias
                and spec.ffn_bias):
            raise ValueError(f"Cannot build the {spec.source} spec: the encoder's projections "
                             "all have biases (query_bias ... ffn_bias).")
        if spec.task == "causal_lm":
            raise ValueError(f"Cannot build the {spec.source} spec: task='causal_lm' with a "
                             "BERT encoder.")
        return
    if not spec.causal or spec.task != "causal_lm":
        raise ValueError(
            f"Cannot build the {spec.source} spec: a {spec.architecture} model is a causal "
            f"language model. Received: causal={spec.causal}, task={spec.task!r}")
    if spec.embedding_norm or spec.num_segments or spec.pooler:
        raise ValueError(
            f"Cannot build the {spec.source} spec: a decoder-only model has no embedding "
            f"norm, token types or pooler. Received: embedding_norm={spec.embedding_norm}, "
            f"type_vocab_size={spec.num_segments}, pooler={spec.pooler}")
    if spec.final_norm != spec.normalize_first:
        raise ValueError(
            f"Cannot build the {spec.source} spec: keras_attn's decoder-only stack closes "
            "pre-norm blocks with a final norm, post-norm ones without. Received: "
            f"final_norm={spec.final_norm}, norm_first={spec.normalize_first}")
    if spec.embedding_dropout != spec.dropout:
        raise ValueError(
            f"Cannot build the {spec.source} spec: one dropout rate for the embedding and the "
            f"blocks. Received: embedding_dropout={spec.embedding_dropout}, "
            f"dropout={spec.dropout}")


def _norm_targets(layer, prefix: str, spec: ArchitectureSpec) -> dict:
    # A post-norm block's norm sits inside its `AddNorm`.
    norm = getattr(layer, "layer_norm", layer)
    if spec.norm == "rms":
        return {f"{prefix}/scale": norm.scale}
    return {f"{prefix}/scale": norm.gamma, f"{prefix}/offset": norm.beta}


def _dense_targets(dense, prefix: str) -> dict:
    targets = {f"{prefix}/kernel": dense.kernel}
    if dense.use_bias:
        targets[f"{prefix}/bias"] = dense.bias
    return targets


def _stack_targets(stack, spec: ArchitectureSpec) -> dict:
    """Canonical key -> the stack's variable that holds it."""
    embedding = stack.embedding
    targets = {"token_embedding/embeddings": embedding.token_embedding.embeddings}
    if embedding.position_embedding is not None:
        targets["position_embedding/embeddings"] = embedding.position_embedding.embeddings
    if embedding.token_type_embedding is not None:
        targets["token_type_embedding/embeddings"] = embedding.token_type_embedding.embeddings
    if embedding.embedding_norm is not None:
        targets.update(_norm_targets(embedding.embedding_norm, "embedding_norm", spec))
    for i, block in enumerate(stack.blocks):
        p = f"layers/{i}"
        targets.update(_norm_targets(block.self_attention_norm, f"{p}/attention_norm", spec))
        attention = block.self_attention
        for name in ("query", "key", "value", "output"):
            targets.update(_dense_targets(getattr(attention, f"{name}_dense"),
                                          f"{p}/attention/{name}"))
        targets.update(_norm_targets(block.ffn_norm, f"{p}/ffn_norm", spec))
        ffn = block.ffn
        for name in (("gate",) if ffn.gated else ()) + ("hidden", "output"):
            targets.update(_dense_targets(getattr(ffn, f"{name}_dense"), f"{p}/ffn/{name}"))
    if stack.final_norm is not None:
        targets.update(_norm_targets(stack.final_norm, "final_norm", spec))
    head = stack.head
    if head is not None and spec.task == "causal_lm" and head.output_dense is not None:
        targets["lm_head/kernel"] = head.output_dense.kernel
    if head is not None and spec.task == "masked_lm":
        targets.update(_dense_targets(head.transform_dense, "mlm_head/dense"))
        targets.update({"mlm_head/norm/scale": head.transform_norm.gamma,
                        "mlm_head/norm/offset": head.transform_norm.beta})
        if head.output_dense is not None:
            targets["mlm_head/decoder/kernel"] = head.output_dense.kernel
            targets["mlm_head/bias"] = head.output_dense.bias
        else:
            targets["mlm_head/bias"] = head.bias
    return targets


def set_weights(model: keras.Model, spec: ArchitectureSpec,
                weights: dict[str, np.ndarray]) -> None:
    """Assign the canonical `weights` to a model `build_model` made for `spec`.

    Args:
        model: the `keras.Model` of `build_model(spec, ...)`.
        spec: `ArchitectureSpec`.
        weights: the canonical dict (`keras_attn.checkpoints.canonical`), any float dtype; each
            array is cast to its variable's dtype.

    Raises:
        ValueError: `weights` does not fit `spec` (missing, unexpected or misshapen keys), or
            `model` is not one `build_model` made for it.
    """
    check_canonical(weights, spec)
    stack_name = "encoder" if spec.architecture == "bert" else "decoder"
    try:
        stack = model.get_layer(stack_name)
    except ValueError as error:
        raise ValueError(f"Argument `model` must be a model of `build_model` with a layer "
                         f"{stack_name!r}. Received: model={model.name!r}") from error
    targets = _stack_targets(stack, spec)
    if spec.pooler and spec.task == "encoder":
        pooler = model.get_layer("pooler")
        targets.update({"pooler/kernel": pooler.kernel, "pooler/bias": pooler.bias})
    # A masked LM's logits do not read the pooler (keras-hub's BertMaskedLM keeps one): it is
    # not part of the model (build the spec with task="encoder" for the pooled output).
    unused = {"pooler/kernel", "pooler/bias"} if spec.task == "masked_lm" else set()
    missing = sorted(set(weights) - set(targets) - unused)
    if missing:
        raise ValueError(f"Argument `model` has no place for the weights {missing[:8]}.")
    for key, variable in targets.items():
        value = np.asarray(weights[key])
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"The weight {key!r} has shape {value.shape}; the model's "
                             f"variable {variable.path} has {tuple(variable.shape)}.")
        variable.assign(value.astype(np.float32) if value.dtype != np.float32 else value)


@legacy.records_given
def build_model(spec: ArchitectureSpec, weights: dict[str, np.ndarray] | None = None,
                dtype: str | None = None, max_sequence_length: int | None = None,
                **kernel) -> keras.Model:
    """The keras_attn model of a pretrained architecture, with its weights.

    Causal language models (Llama, Mistral, Qwen2, GPT-2) are a `TransformerDecoderOnly`
    named `"decoder"`, so `keras_attn.decoding.generate` decodes them over its static cache
    (give it the checkpoint's ids: `generation_ids(spec)`); BERT is a `TransformerEncoder`
    named `"encoder"` with BERT's embedding (positions, token types, LayerNorm) and, for
    `BertForMaskedLM`, its MLM head. Inputs are a dict (keras-hub's names):

    - `token_ids`: int32 `(B, T)`;
    - `padding_mask`: bool `(B, T)`, True at real tokens (no id is padding: Llama's id 0 is
      a token). Positions count from 0 in every row: pad on the right.
    - BERT only, `segment_ids`: int32 `(B, T)` token types.

    Dropout (`spec.dropout`, training only) acts where keras_attn's blocks put it: on the
    attention weights, the residual branches and also the FFN's hidden activations (Hugging
    Face's blocks have none there); inference is unaffected.

    Args:
        spec: `ArchitectureSpec` (`load_hf_checkpoint`, `spec_from_keras_hub`).
        weights: optional canonical weights (`canonical`); None leaves the model's random
            initialization. Defaults to `None`.
        dtype: optional `"float32"`, `"bfloat16"` or `"float16"`, the model's dtype (variables
            and computation; logits are float32). Defaults to `spec.dtype` (the weights').
        max_sequence_length: optional int, the longest decoding cache (learned positions: at
            most `spec.max_sequence_length`, which is the default there). Defaults to `None`.
        **kernel: the attention kernel, `AttentionConfig`'s `implementation` (`"dense"`,
            `"chunked"`, `"local"` with a `sliding_window`, ...), `chunk_size` and
            `flash_attention`. Default to the configuration's.

    Returns:
        `keras.Model`: causal LM -> float32 logits `(B, T, vocab_size)`; masked LM -> float32
        logits `(B, T, vocab_size)`; encoder -> `{"sequence_output": (B, T, D),
        "pooled_output": (B, D)}` (the pooled output only when the checkpoint has a pooler;
        a masked LM's logits never read it, and its model has none).

    Raises:
        ValueError: an argument out of range, or a spec the assembly cannot express (naming
            the spec field; the config keys behind them are refused when the spec is read).

    Example:
    >>> spec, weights = load_hf_checkpoint("path/to/Qwen2.5-0.5B", dtype="float32")
    >>> model = build_model(spec, weights)
    >>> model({"token_ids": ids, "padding_mask": ids >= 0}).shape  # (B, T, 151936)
    """
    check_spec(spec)
    dtype = spec.dtype if dtype is None else dtype
    check_one_of("dtype", dtype, DTYPES)
    max_sequence_length = legacy.rename(  # keras_attn 0.2's name
        kernel, "build_model", {"max_length": "max_sequence_length"}, said=legacy.said(
            build_model, max_sequence_length=max_sequence_length)).get(
        "max_sequence_length", max_sequence_length)
    unknown = sorted(set(kernel) - set(KERNEL_OPTIONS))
    if unknown:
        raise TypeError(f"build_model() got unexpected keyword arguments {unknown}")
    _check_supported(spec)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    padding_mask = keras.Input((None,), dtype="bool", name="padding_mask")
    inputs = {"token_ids": token_ids, "padding_mask": padding_mask}
    if spec.architecture == "bert":
        segment_ids = keras.Input((None,), dtype="int32", name="segment_ids")
        inputs["segment_ids"] = segment_ids
        encoder = _encoder(spec, dtype, kernel)
        outputs = encoder(token_ids, padding_mask=padding_mask,
                          token_type_ids=segment_ids if spec.num_segments else None)
        if spec.task == "encoder":
            outputs = {"sequence_output": outputs}
            if spec.pooler:
                pooler = keras.layers.Dense(spec.hidden_dim, activation="tanh",
                                            name="pooler", dtype=dtype)
                outputs["pooled_output"] = pooler(outputs["sequence_output"][:, 0, :])
    else:
        decoder = _decoder(spec, dtype, kernel, max_sequence_length)
        outputs = decoder(token_ids, padding_mask=padding_mask)
    model = keras.Model(inputs, outputs, name=f"{spec.architecture}_{spec.task}")
    if weights is not None:
        set_weights(model, spec, weights)
    return model


def generation_ids(spec: ArchitectureSpec) -> dict:
    """The checkpoint's special ids as `keras_attn.decoding.generate` takes them.

    Returns:
        dict: `stop_token_ids` (the checkpoint's end ids: an int, a tuple when it has several,
        None when none; keras_attn 0.2's `eos_id`), `pad_id` (its padding id; the first end id
        when it has none, as `transformers` pads; 0 when it has neither) and
        `suppressed_ids=()` (a checkpoint's own ids may all be generated, unlike keras_attn's
        reserved ones): `keras_attn.decoding.special_ids` derives the rest from them.
    """
    check_spec(spec)
    eos = tuple(spec.eos_token_ids)
    pad = spec.pad_token_id
    if pad is None:
        pad = eos[0] if eos else 0
    return {"stop_token_ids": None if not eos else eos[0] if len(eos) == 1 else eos,
            "pad_id": pad, "suppressed_ids": ()}


def from_pretrained(directory: str, dtype: str | None = None,
                    max_sequence_length: int | None = None, tokenizer: bool = True,
                    **kernel) -> tuple:
    """A Hugging Face checkpoint directory as a keras_attn model, its tokenizer and its spec.

    `load_hf_checkpoint`, then `build_model`, then (TensorFlow) `load_tokenizer`.

    Args:
        directory: str, a `save_pretrained` / downloaded directory (`config.json`,
            safetensors weights, tokenizer files).
        dtype: optional `"float32"`, `"bfloat16"` or `"float16"`: the model's dtype.
            Defaults to the stored weights' (a bfloat16 checkpoint loads as bfloat16).
        max_sequence_length: optional int, the longest decoding cache (`build_model`).
            Defaults to `None`.
        tokenizer: bool, also load the tokenizer (needs TensorFlow and tensorflow-text);
            False returns None in its place. Defaults to `True`.
        **kernel: the attention kernel options of `build_model` (`implementation`,
            `chunk_size`, `flash_attention`).

    Returns:
        `(model, tokenizer, spec)`: the `keras.Model` of `build_model`, the
        `CheckpointTokenizer` (or None) and the `ArchitectureSpec`.

    Example:
    >>> model, tokenizer, spec = from_pretrained("path/to/Llama-3.2-1B", dtype="float32")
    >>> ids = tokenizer.encode(["The Time Machine"]).to_tensor()
    >>> keras_attn.decoding.generate(model, ids, max_length=64, **generation_ids(spec))
    """
    from keras_attn.checkpoints.hf_weights import load_hf_checkpoint

    if dtype is not None:
        check_one_of("dtype", dtype, DTYPES)
    spec, weights = load_hf_checkpoint(directory, dtype)
    model = build_model(spec, weights, max_sequence_length=max_sequence_length, **kernel)
    loaded = None
    if tokenizer:
        from keras_attn.checkpoints.tokenizer import load_tokenizer

        loaded = load_tokenizer(directory)
    return model, loaded, spec
