"""The canonical weights of a pretrained Transformer: one flat dict of NumPy arrays.

Both converters (`canonical_from_hf_state_dict`, `canonical_from_keras_hub`) return this dict,
so loading into a keras_attn model is one mapping from it. Kernels are `(in, out)` (`y = x W +
b`, Keras' `Dense` layout: torch's `Linear.weight` transposed); heads are flattened head-major
(column `h * head_dim + j` is feature `j` of head `h`), and the query and key features are in
the "rotate half" RoPE layout (feature `j` turns with `j + head_dim / 2`). `D` = hidden_size,
`V` = vocab_size, `F` = intermediate_size, `H` = num_heads, `K` = num_kv_heads, `d` = head_dim.

| key | shape | when | meaning |
|---|---|---|---|
| `token_embedding/embeddings` | (V, D) | always | token embedding |
| `position_embedding/embeddings` | (max_positions, D) | `position == "learned"` | added position table, row p for position p |
| `token_type_embedding/embeddings` | (type_vocab_size, D) | `type_vocab_size > 0` | added segment table |
| `embedding_norm/scale`, `/offset` | (D,) | `embedding_norm` | norm of the summed embeddings |
| `layers/{i}/attention_norm/scale` (`/offset` for layer norm) | (D,) | always | pre-norm: before attention; post-norm: after the attention residual |
| `layers/{i}/attention/query/kernel` | (D, H d) | always | query projection |
| `layers/{i}/attention/key/kernel`, `/value/kernel` | (D, K d) | always | key and value projections |
| `layers/{i}/attention/output/kernel` | (H d, D) | always | attention output projection |
| `layers/{i}/attention/{query,key,value,output}/bias` | (H d,), (K d,), (K d,), (D,) | `{query,key,value,output}_bias` | their biases |
| `layers/{i}/ffn_norm/scale` (`/offset`) | (D,) | always | pre-norm: before the FFN; post-norm: after its residual |
| `layers/{i}/ffn/gate/kernel` | (D, F) | `gated_ffn` | `act(x W_gate)` |
| `layers/{i}/ffn/hidden/kernel` | (D, F) | always | gated: multiplies the gate; plain: `act(x W_hidden)` |
| `layers/{i}/ffn/output/kernel` | (F, D) | always | FFN output projection |
| `layers/{i}/ffn/{gate,hidden,output}/bias` | (F,), (F,), (D,) | `ffn_bias` | their biases |
| `final_norm/scale` (`/offset`) | (D,) | `final_norm` | norm after the last block |
| `lm_head/kernel` | (D, V) | causal_lm, untied | logits = h W |
| `mlm_head/dense/kernel`, `/bias` | (D, D), (D,) | masked_lm | MLM transform: norm(act(h W + b)) |
| `mlm_head/norm/scale`, `/offset` | (D,) | masked_lm | its layer norm |
| `mlm_head/decoder/kernel` | (D, V) | masked_lm, untied | logits = t W + bias |
| `mlm_head/bias` | (V,) | masked_lm | the logits' bias |
| `pooler/kernel`, `/bias` | (D, D), (D,) | `pooler` | BERT pooler: tanh(h[:, 0] W + b) |

Tied embeddings (`spec.tie_word_embeddings`) have no `lm_head/kernel` / `mlm_head/decoder/kernel`:
the logits are `h @ token_embedding.T`.
"""

from __future__ import annotations

import numpy as np

from keras_attn.checkpoints.spec import ArchitectureSpec


def _norm(prefix: str, spec: ArchitectureSpec, size: int) -> dict[str, tuple]:
    shapes = {f"{prefix}/scale": (size,)}
    if spec.norm == "layer":
        shapes[f"{prefix}/offset"] = (size,)
    return shapes


def _layer(i: int, spec: ArchitectureSpec) -> dict[str, tuple]:
    d, q, kv, f = (spec.hidden_dim, spec.num_heads * spec.head_dim,
                   spec.num_key_value_heads * spec.head_dim, spec.intermediate_dim)
    p = f"layers/{i}"
    shapes = _norm(f"{p}/attention_norm", spec, d)
    projections = {"query": (d, q), "key": (d, kv), "value": (d, kv), "output": (q, d)}
    for name, shape in projections.items():
        shapes[f"{p}/attention/{name}/kernel"] = shape
        if getattr(spec, f"{name}_bias"):
            shapes[f"{p}/attention/{name}/bias"] = shape[1:]
    shapes.update(_norm(f"{p}/ffn_norm", spec, d))
    ffn = {"hidden": (d, f), "output": (f, d)}
    if spec.gated_ffn:
        ffn = {"gate": (d, f), **ffn}
    for name, shape in ffn.items():
        shapes[f"{p}/ffn/{name}/kernel"] = shape
        if spec.ffn_bias:
            shapes[f"{p}/ffn/{name}/bias"] = shape[1:]
    return shapes


def canonical_shapes(spec: ArchitectureSpec) -> dict[str, tuple[int, ...]]:
    """Every canonical key `spec` has, with its shape (see the module's table).

    Args:
        spec: `ArchitectureSpec`.

    Returns:
        dict from key to shape tuple, in model order.
    """
    d, v = spec.hidden_dim, spec.vocabulary_size
    shapes: dict[str, tuple[int, ...]] = {"token_embedding/embeddings": (v, d)}
    if spec.position == "learned":
        shapes["position_embedding/embeddings"] = (spec.max_sequence_length, d)
    if spec.num_segments:
        shapes["token_type_embedding/embeddings"] = (spec.num_segments, d)
    if spec.embedding_norm:
        shapes.update(_norm("embedding_norm", spec, d))
    for i in range(spec.num_layers):
        shapes.update(_layer(i, spec))
    if spec.final_norm:
        shapes.update(_norm("final_norm", spec, d))
    if spec.task == "causal_lm" and not spec.tie_word_embeddings:
        shapes["lm_head/kernel"] = (d, v)
    if spec.task == "masked_lm":
        shapes.update({"mlm_head/dense/kernel": (d, d), "mlm_head/dense/bias": (d,),
                       "mlm_head/norm/scale": (d,), "mlm_head/norm/offset": (d,)})
        if not spec.tie_word_embeddings:
            shapes["mlm_head/decoder/kernel"] = (d, v)
        shapes["mlm_head/bias"] = (v,)
    if spec.pooler:
        shapes.update({"pooler/kernel": (d, d), "pooler/bias": (d,)})
    return shapes


def check_spec(spec, name: str = "spec") -> None:
    """Raise the ValueError naming `name` unless `spec` is an `ArchitectureSpec`."""
    if not isinstance(spec, ArchitectureSpec):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            f"Received an invalid value for argument `{name}`, expected an ArchitectureSpec "
            f"(`load_hf_checkpoint`, `spec_from_keras_hub`). Received: "
            f"{name}={type(spec).__name__}")


def check_canonical(weights: dict[str, np.ndarray], spec: ArchitectureSpec) -> None:
    """Raise unless `weights` has exactly the canonical keys of `spec`, with their shapes.

    Args:
        weights: dict of NumPy arrays.
        spec: `ArchitectureSpec`.

    Raises:
        ValueError: `spec` is not an `ArchitectureSpec` or `weights` not a dict (naming the
            argument), or naming the missing, unexpected or misshapen keys.
    """
    check_spec(spec)
    if not isinstance(weights, dict):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Received an invalid value for argument `weights`, expected the dict of canonical "
            f"weights (name -> array). Received: weights={type(weights).__name__}")
    expected = canonical_shapes(spec)
    missing = [key for key in expected if key not in weights]
    extra = sorted(set(weights) - set(expected))
    wrong = [f"{key}: expected {expected[key]}, received {tuple(np.shape(weights[key]))}"
             for key in expected if key in weights
             and tuple(np.shape(weights[key])) != tuple(expected[key])]
    if missing or extra or wrong:
        raise ValueError(
            f"The weights do not fit the {spec.source} spec. Missing: {missing[:8]}; "
            f"unexpected: {extra[:8]}; wrong shapes: {wrong[:8]}")
