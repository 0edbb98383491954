"""A Hugging Face state dict (torch names and layouts) -> the canonical weights.

`torch.nn.Linear.weight` is `(out, in)` and is transposed; GPT-2's `Conv1D.weight` is already
`(in, out)`, and its fused `c_attn` (`(D, 3 D)`, columns query | key | value) is split. Tied
heads (`tie_word_embeddings`) are not stored by `save_pretrained`; when a checkpoint stores
them anyway they must equal the embedding. The returned arrays are views of the input arrays
(no copies).

Names are accepted with or without the base model's prefix (`model.`, `transformer.`, `bert.`),
and LayerNorm parameters as `weight`/`bias` or the older `gamma`/`beta`. Dropped on purpose, as
transformers drops them when it loads the same class: buffers (`rotary_emb.inv_freq`, GPT-2's
`attn.bias`/`attn.masked_bias` causal masks, BERT's `position_ids`/`token_type_ids`), BERT's
next-sentence head (`cls.seq_relationship`), the MLM head of a `BertModel` checkpoint and the
pooler of a `BertForMaskedLM` one. Any other name left over is an error: it is a weight the
conversion would lose.
"""

from __future__ import annotations

import re

import numpy as np

from keras_attn.checkpoints.canonical import canonical_shapes, check_canonical
from keras_attn.checkpoints.files import (
    DTYPES,
    is_floating,
    read_config,
    read_safetensors,
)
from keras_attn.checkpoints.hf_config import spec_from_hf_config
from keras_attn.checkpoints.spec import ArchitectureSpec

PREFIXES = {"llama": "model.", "mistral": "model.", "qwen2": "model.", "gpt2": "transformer.",
            "bert": "bert."}
EMBEDDING = {"llama": "embed_tokens.weight", "mistral": "embed_tokens.weight",
             "qwen2": "embed_tokens.weight", "gpt2": "wte.weight",
             "bert": "embeddings.word_embeddings.weight"}
DROPPED = (r"(.*\.)?rotary_emb\.inv_freq", r"(.*\.)?h\.\d+\.attn\.(masked_)?bias",
           r"(.*\.)?embeddings\.(position_ids|token_type_ids)", r"cls\.seq_relationship\..*")
LLAMA_PROJECTIONS = {"query": "self_attn.q_proj", "key": "self_attn.k_proj",
                     "value": "self_attn.v_proj", "output": "self_attn.o_proj",
                     "gate": "mlp.gate_proj", "hidden": "mlp.up_proj",
                     "output_ffn": "mlp.down_proj"}
BERT_PROJECTIONS = {"query": "attention.self.query", "key": "attention.self.key",
                    "value": "attention.self.value", "output": "attention.output.dense",
                    "hidden": "intermediate.dense", "output_ffn": "output.dense"}


def _transpose(array: np.ndarray) -> np.ndarray:
    return array.T


def _identity(array: np.ndarray) -> np.ndarray:
    return array


def _column_slice(start: int, stop: int):
    def take(array: np.ndarray) -> np.ndarray:
        return array[..., start:stop]  # (D, 3D) -> (D, stop - start); (3D,) -> (stop - start,)
    return take


def _canonical_name(key: str) -> tuple[str, str]:
    """`layers/3/attention/query/kernel` -> (`layers/3/attention/query`, `kernel`)."""
    owner, _, leaf = key.rpartition("/")
    return owner, leaf


def _sources(spec: ArchitectureSpec, base: str) -> dict[str, tuple[tuple[str, ...], object]]:
    """For every canonical key: the Hugging Face names it may be stored under, and the function
    that turns that tensor into the canonical array."""
    family = spec.architecture
    sources = {}
    for key in canonical_shapes(spec):
        owner, leaf = _canonical_name(key)
        parts = owner.split("/")
        if parts[0] == "layers":
            names, fn = _layer_source(family, int(parts[1]), "/".join(parts[2:]), leaf, spec)
            names = tuple(base + name for name in names)
        else:
            names, fn = _global_source(family, owner, leaf, base)
        sources[key] = (names, fn)
    return sources


def _norm_names(name: str, leaf: str) -> tuple[str, ...]:
    return (f"{name}.weight", f"{name}.gamma") if leaf == "scale" else (
        f"{name}.bias", f"{name}.beta")


def _layer_source(family: str, i: int, part: str, leaf: str, spec: ArchitectureSpec):
    torch_leaf = "weight" if leaf == "kernel" else "bias"
    if family == "gpt2":
        prefix = f"h.{i}."
        norms = {"attention_norm": "ln_1", "ffn_norm": "ln_2"}
        if part in norms:
            return _norm_names(prefix + norms[part], leaf), _identity
        if part in ("attention/query", "attention/key", "attention/value"):
            d = spec.hidden_dim
            start = {"attention/query": 0, "attention/key": d, "attention/value": 2 * d}[part]
            return (f"{prefix}attn.c_attn.{torch_leaf}",), _column_slice(start, start + d)
        conv = {"attention/output": "attn.c_proj", "ffn/hidden": "mlp.c_fc",
                "ffn/output": "mlp.c_proj"}[part]
        return (f"{prefix}{conv}.{torch_leaf}",), _identity
    if family == "bert":
        prefix = f"encoder.layer.{i}."
        norms = {"attention_norm": "attention.output.LayerNorm", "ffn_norm": "output.LayerNorm"}
        if part in norms:
            return _norm_names(prefix + norms[part], leaf), _identity
        table = BERT_PROJECTIONS
    else:
        prefix = f"layers.{i}."
        norms = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
        if part in norms:
            return (f"{prefix}{norms[part]}.weight",), _identity
        table = LLAMA_PROJECTIONS
    name = part.split("/")[1]
    if part == "ffn/output":
        name = "output_ffn"
    return (f"{prefix}{table[name]}.{torch_leaf}",), (
        _transpose if leaf == "kernel" else _identity)


def _global_source(family: str, owner: str, leaf: str, base: str):
    if owner == "lm_head":
        return ("lm_head.weight",), _transpose
    if owner.startswith("mlm_head"):
        names = {"mlm_head/dense": ("cls.predictions.transform.dense", _transpose),
                 "mlm_head/norm": ("cls.predictions.transform.LayerNorm", _identity),
                 "mlm_head/decoder": ("cls.predictions.decoder", _transpose)}
        if owner == "mlm_head":
            return ("cls.predictions.bias",), _identity
        name, fn = names[owner]
        if owner == "mlm_head/norm":
            return _norm_names(name, leaf), fn
        return (f"{name}.{'weight' if leaf == 'kernel' else 'bias'}",), (
            fn if leaf == "kernel" else _identity)
    if owner == "pooler":
        return (f"{base}pooler.dense.{'weight' if leaf == 'kernel' else 'bias'}",), (
            _transpose if leaf == "kernel" else _identity)
    table = {
        "llama": {"token_embedding": "embed_tokens.weight", "final_norm": "norm"},
        "gpt2": {"token_embedding": "wte.weight", "position_embedding": "wpe.weight",
                 "final_norm": "ln_f"},
        "bert": {"token_embedding": "embeddings.word_embeddings.weight",
                 "position_embedding": "embeddings.position_embeddings.weight",
                 "token_type_embedding": "embeddings.token_type_embeddings.weight",
                 "embedding_norm": "embeddings.LayerNorm"},
    }[family if family in ("gpt2", "bert") else "llama"]
    name = table[owner]
    if owner.endswith("norm"):
        if family in ("gpt2", "bert"):
            return tuple(base + n for n in _norm_names(name, leaf)), _identity
        return (f"{base}{name}.weight",), _identity
    return (base + name,), _identity


def _base_prefix(state_dict: dict, spec: ArchitectureSpec) -> str:
    family = spec.architecture
    for prefix in (PREFIXES[family], ""):
        if prefix + EMBEDDING[family] in state_dict:
            return prefix
    raise ValueError(f"The state dict has no token embedding for {spec.source}: expected "
                     f"`{PREFIXES[family]}{EMBEDDING[family]}` (or without the prefix). Names "
                     f"found: {sorted(state_dict)[:8]}")


def _other_heads(spec: ArchitectureSpec, base: str) -> tuple[str, ...]:
    """Heads the converted class does not have and transformers drops when loading it."""
    if spec.architecture != "bert":
        return ()
    return (r"cls\..*",) if spec.task == "encoder" else (re.escape(base) + r"pooler\..*",)


def _check_tied(state_dict: dict, spec: ArchitectureSpec, base: str) -> set[str]:
    """The stored copies of tied weights, checked equal to what they are tied to."""
    ties = {}
    embedding = state_dict[base + EMBEDDING[spec.architecture]]
    if spec.tie_word_embeddings:
        ties = {"lm_head.weight": embedding, "cls.predictions.decoder.weight": embedding}
    if spec.task == "masked_lm" and "cls.predictions.bias" in state_dict:
        ties["cls.predictions.decoder.bias"] = state_dict["cls.predictions.bias"]
    used = set()
    for name, target in ties.items():
        if name in state_dict:
            if state_dict[name].shape != target.shape or not np.array_equal(
                    state_dict[name], target):
                raise ValueError(f"Cannot convert the checkpoint: config key "
                                 f"`tie_word_embeddings`={spec.tie_word_embeddings!r} ties "
                                 f"`{name}` to another weight, but the stored tensors differ.")
            used.add(name)
    return used


def canonical_from_hf_state_dict(state_dict: dict[str, np.ndarray], spec: ArchitectureSpec
                                 ) -> dict[str, np.ndarray]:
    """The canonical weights (see `keras_attn.checkpoints.canonical`) of a Hugging Face model.

    Args:
        state_dict: dict from torch parameter names to NumPy arrays, as `read_safetensors`
            returns them (or `{k: v.numpy() for k, v in model.state_dict().items()}`).
        spec: `ArchitectureSpec` of the checkpoint (`spec_from_hf_config`).

    Returns:
        dict from canonical key to NumPy array (views of `state_dict`'s arrays).

    Raises:
        ValueError: a weight is missing, misshapen, or left over (a weight the conversion would
            lose), or tied weights differ.

    Example:
    >>> spec = spec_from_hf_config(*read_config(path))
    >>> weights = canonical_from_hf_state_dict(read_safetensors(path), spec)
    >>> weights["layers/0/attention/query/kernel"].shape  # (hidden_size, heads * head_dim)
    """
    base = _base_prefix(state_dict, spec)
    weights, used = {}, _check_tied(state_dict, spec, base)
    missing = []
    for key, (names, fn) in _sources(spec, base).items():
        found = [name for name in names if name in state_dict]
        if not found:
            missing.append(f"{key} (from {' or '.join(names)})")
            continue
        weights[key] = fn(state_dict[found[0]])
        used.add(found[0])
    if missing:
        raise ValueError(f"The {spec.source} state dict lacks weights: {missing[:8]}")
    dropped = re.compile("|".join(DROPPED + _other_heads(spec, base)))
    left = sorted(name for name in set(state_dict) - used if not dropped.fullmatch(name))
    if left:
        raise ValueError(f"The {spec.source} state dict holds weights the conversion does not "
                         f"know (they would be lost): {left[:8]}")
    check_canonical(weights, spec)
    return weights


def _dtype_name(array: np.ndarray) -> str:
    return "bfloat16" if array.dtype.name == "bfloat16" else array.dtype.name


def load_hf_checkpoint(directory: str, dtype: str | None = None
                       ) -> tuple[ArchitectureSpec, dict[str, np.ndarray]]:
    """A Hugging Face checkpoint directory's architecture and canonical weights, without torch.

    Args:
        directory: str, holding `config.json` (and optionally `generation_config.json`) and
            `model.safetensors` or a sharded `model.safetensors.index.json`.
        dtype: None, `"float32"`, `"bfloat16"` or `"float16"`: the dtype of the returned
            floating weights. None keeps the stored one (bfloat16 as `ml_dtypes.bfloat16`).
            Defaults to `None`.

    Returns:
        `(spec, weights)`: the `ArchitectureSpec` (its `dtype` is that of the returned weights)
        and the canonical dict of NumPy arrays.

    Raises:
        ValueError: naming the config key of anything the conversion cannot honour, the
            weights that are missing or left over, or (with `dtype=None`) a tensor stored in
            a dtype no model is built in (float64: pass `dtype`).

    Example:
    >>> spec, weights = load_hf_checkpoint("path/to/Llama-3.2-1B", dtype="float32")
    """
    config, generation = read_config(directory)
    spec = spec_from_hf_config(config, generation)
    state_dict = read_safetensors(directory, dtype)
    if dtype is None:
        _check_stored_dtypes(state_dict, directory)
    weights = canonical_from_hf_state_dict(state_dict, spec)
    return spec.replace(dtype=_dtype_name(weights["token_embedding/embeddings"])), weights


def _check_stored_dtypes(state_dict: dict[str, np.ndarray], directory: str) -> None:
    """Kept as stored (`dtype=None`), every floating tensor must be of a dtype a model is
    built in; a float64 checkpoint is refused here, naming a tensor, not later by `dtype`."""
    for name, array in state_dict.items():
        if is_floating(array) and _dtype_name(array) not in DTYPES:
            raise ValueError(
                f"The checkpoint in {directory!r} stores {name!r} as {_dtype_name(array)}; "
                f"models are built in one of {sorted(DTYPES)}: pass `dtype` (e.g. "
                "dtype='float32') to cast the weights when they are read.")
