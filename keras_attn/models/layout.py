"""Where every weight of a keras_attn model goes on a device mesh: one `keras.distribution`
layout map for all the stacks and builders (and the pretrained models, which are the same
assembly).

`keras.distribution.ModelParallel` places each variable by its path (`variable.path`, e.g.
`"decoder/block_0/self_attention/query_dense/kernel"`). The one assembly names its parts the
same way in every model, so one map of path patterns covers `causal_lm`,
`transformer_seq2seq`, `nat_seq2seq`, the stacks (`TransformerEncoder`, `TransformerDecoder`,
`TransformerDecoderOnly`, `CMLMDecoder`) under any name, `bahdanau_seq2seq`, and the Llama,
Mistral, Qwen2, GPT-2 and BERT models of `keras_attn.checkpoints`.

The split is Megatron-LM's (Shoeybi et al., 2019, https://arxiv.org/abs/1909.08053): in each
block the first projection is split by its outputs (column-parallel: each device holds whole
heads of the query/key/value projections, a slice of the FFN's hidden units) and the second by
its inputs (row-parallel: the attention's output projection, the FFN's output projection), so a
block needs one all-reduce forward and one backward per sublayer. As in keras-hub's
`Backbone.get_layout_map`, the other axis of each of these kernels is split over the
data-parallel axis (each data-parallel replica stores a slice, gathered when used; on a mesh
whose data-parallel axis has one device that is plain Megatron).

The token embedding and the output projection are split by feature (the model width `d`),
not by vocabulary as keras-hub's Llama and Gemma maps do: JAX refuses a split that does not
divide a dimension, and real vocabularies often do not divide (GPT-2's 50257, BERT's 30522,
a CMLM decoder's `vocabulary_size + 1` with its `<mask>` token), where `d` usually does on a mesh
that divides the heads. The price: each device computes the whole `(batch, seq_len, vocab)`
logits of its batch slice (partial sums over its features, all-reduced). Everything else
(norms, position tables, biases of row-parallel or vocabulary-sized layers, the GRUs'
recurrent weights, small heads) is replicated.
"""

from __future__ import annotations

import keras

# Any prefix: the model's name and the stack's (`decoder/`, `encoder/`, a user's own).
_ANY = r"(?:.*/)?"
_ATTENTION = _ANY + r"[^/]*attention/"  # self_attention, cross_attention, Bahdanau's attention


def _rules(model: str, data: str | None) -> dict[str, tuple]:
    """Path pattern -> axes of the variable; the patterns never match the same path twice."""
    # Token embeddings (vocabulary, d): split by feature, never by token (see above).
    rules = {_ANY + r"(?:token_)?embedding/embeddings": (None, model)}
    # Megatron's pairs: the attention's query/key/value projections (d, heads · head_dim),
    # whole heads per device (also Bahdanau's query/key, by hidden unit), then its output
    # projection (heads · head_dim, d); the FFN's hidden and gate (d, intermediate_dim), then its output
    # (intermediate_dim, d). The first are split by output (column-parallel) with their biases, the
    # second by input (row-parallel: partial sums all-reduced); LoRA's factors A (d_in, r) and
    # B (r, d_out) follow their kernel.
    for owner, first, second in ((_ATTENTION, "(?:query|key|value)", "output"),
                                 (_ANY + "ffn/", "(?:hidden|gate)", "output")):
        rules[f"{owner}{first}_dense/kernel"] = (data, model)
        rules[f"{owner}{first}_dense/bias"] = (model,)
        rules[f"{owner}{first}_dense/lora_kernel_b"] = (None, model)
        rules[f"{owner}{second}_dense/kernel"] = (model, data)
        rules[f"{owner}{second}_dense/lora_kernel_a"] = (model, None)
    # Bahdanau's score vector w_v (units, 1): row-parallel like an output projection.
    rules[_ATTENTION + "score_dense/kernel"] = (model, None)
    # The vocabulary projection (d, vocab) by feature like the embedding: the Transformer
    # stacks' `head`, the Bahdanau decoder's `output_dense`.
    rules[_ANY + "(?:head|decoder)/output_dense/kernel"] = (model, None)
    return rules


def get_layout_map(device_mesh: keras.distribution.DeviceMesh,
                   model_parallel_dim_name: str = "model",
                   data_parallel_dim_name: str | None = "batch"
                   ) -> keras.distribution.LayoutMap:
    """A `keras.distribution.LayoutMap` that shards a keras_attn model's weights Megatron-style.

    The same signature as keras-hub's `Backbone.get_layout_map`; one map serves every
    keras_attn model (the stacks, the builders, the pretrained models). With
    `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=data_parallel_dim_name)`,
    each variable created in its scope is placed by its path:

    | weight (shape) | axes |
    |---|---|
    | `*/token_embedding/embeddings` `(vocab, d)` | `(None, model)` |
    | `*attention/{query,key,value}_dense/kernel` `(d, heads · head_dim)` | `(batch, model)` |
    | their biases | `(model,)` |
    | `*attention/output_dense/kernel` `(heads · head_dim, d)` | `(model, batch)` |
    | `ffn/{hidden,gate}_dense/kernel` `(d, intermediate_dim)`, biases | `(batch, model)`, `(model,)` |
    | `ffn/output_dense/kernel` `(intermediate_dim, d)` | `(model, batch)` |
    | `head/output_dense/kernel` `(d, vocab)` | `(model, None)` |
    | Bahdanau: `embedding`, attention `query/key_dense`, `score_dense` `(units, 1)`, `decoder/output_dense` | as above; `(model, None)` |
    | LoRA factors: B of a column-parallel kernel, A of a row-parallel one | split like it |
    | everything else (norms, position tables, small heads, GRU weights) | replicated |

    Every split dimension must be divisible by the size of its mesh axis (JAX refuses the
    variable otherwise, with an `IndivisibleError` that gives its shape): on a `(2, 4)` mesh,
    `d`, `heads · head_dim`, `num_key_value_heads · head_dim` and `intermediate_dim` by 4 and by 2; the
    vocabulary is never split. For whole heads per device, choose a model-parallel size that
    divides the number of key/value heads.

    Args:
        device_mesh: `keras.distribution.DeviceMesh`, the devices and their axis names.
        model_parallel_dim_name: str, the mesh axis the weights are split over.
            Defaults to `"model"`.
        data_parallel_dim_name: optional str, the mesh axis the batch is split over, which
            also splits the other axis of the large weights (keras-hub's layout); `None`
            splits the weights over the model-parallel axis only (each data-parallel replica
            holds the whole model-parallel slice). Defaults to `"batch"`.

    Returns:
        `keras.distribution.LayoutMap` of path patterns (matched whole against
        `variable.path`); add patterns of your own layers to it before use.

    Raises:
        ValueError: `device_mesh` is not a `DeviceMesh`, or a dimension name is not one of its
            axis names, or both names are the same axis.

    Example:
    ```python
    # JAX on 8 devices (on one CPU: XLA_FLAGS=--xla_force_host_platform_device_count=8).
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"),
                                         keras.distribution.list_devices())
    layout_map = keras_attn.models.get_layout_map(mesh)
    distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                    batch_dim_name="batch")
    with distribution.scope():
        model = keras_attn.models.causal_lm(1024, num_layers=2, hidden_dim=64, num_heads=4,
                                            intermediate_dim=256)
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8)
    kernel = model.get_layer("decoder").blocks[0].ffn.hidden_dense.kernel
    kernel.value.sharding.spec  # P('batch', 'model'): (64, 256) -> (32, 64) on each device
    ```
    """
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Argument `device_mesh` must be a `keras.distribution.DeviceMesh`. Received: "
            f"device_mesh={device_mesh!r} of type {type(device_mesh).__name__}")
    axes = tuple(device_mesh.axis_names)
    for name, value, optional in (("model_parallel_dim_name", model_parallel_dim_name, False),
                                  ("data_parallel_dim_name", data_parallel_dim_name, True)):
        if not (value is None and optional) and value not in axes:
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected one of the "
                f"device mesh's axis names {axes}{' or None' if optional else ''}. "
                f"Received: {name}={value!r}")
    if model_parallel_dim_name == data_parallel_dim_name:
        raise ValueError(
            "Arguments `model_parallel_dim_name` and `data_parallel_dim_name` must name two "
            f"different mesh axes. Received: both {model_parallel_dim_name!r}")
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for pattern, layout in _rules(model_parallel_dim_name, data_parallel_dim_name).items():
        layout_map[pattern] = layout
    return layout_map
