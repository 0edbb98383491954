"""ONNX and LiteRT exports of the tasks' decoding: the forward pass (or the encoder) and the
one-token decode step with its static key/value cache as inputs and outputs, and an
`export.json` saying what a loop needs. `keras_attn.export_steps` is that loop (NumPy and
onnxruntime or LiteRT's interpreter only); `CausalLM.export(path, format="onnx")` and
`Seq2SeqLM.export(path, format="onnx")` write the files. TensorFlow backend.

Files in the export directory (`.onnx` for `"onnx"`, `.tflite` for `"litert"`):

- causal LM: `forward` (`token_ids` int32 `(B, T)`, `padding_mask` bool `(B, T)` -> float32
  `logits` `(B, T, V)`; ONNX: batch and length dynamic; LiteRT: `T = max_length`);
- sequence-to-sequence: `encoder` (`source_ids` int32 `(B, S)` -> the decoding state: the
  cross-attention keys and values, the source mask, the self-attention caches at zero);
- both: `decode_step` (`token_ids` int32 `(B, 1)`, `index` int32 `()` the token's position,
  then the state tensors -> `logits` float32 `(B, V)` predicting position `index + 1`, then the
  updated state, named as its inputs plus `_out`; `export.json` lists both). The
  self-attention caches have the static length `max_length` (`(B, H_kv, max_length,
  head_dim)`).

The decode step is traced with `keras_attn.layers.cache.gathered_cache_writes`: its caches are
written by a gather and a select, the same numbers as the slice update that tf2onnx (1.17)
cannot convert (`XlaDynamicUpdateSlice`).
"""

from __future__ import annotations

import json
import os
import tempfile

import keras

from keras_attn._checks import check_int, check_new_directory
from keras_attn.layers.cache import gathered_cache_writes

FORMATS = ("onnx", "litert")
SUFFIX = {"onnx": ".onnx", "litert": ".tflite"}
OPSET = 17  # the ONNX opset written
METADATA = "export.json"


def check_format(task: str, format: str, formats=("tf_saved_model",) + FORMATS) -> str:
    """`format`, or a ValueError naming it (an unknown format, or ONNX / LiteRT on a backend
    other than TensorFlow: the decode step is converted from a TensorFlow graph)."""
    if format not in formats:
        raise ValueError(f"Received an invalid value for argument `format`, expected one of "
                         f"{formats}. Received: format={format!r}")
    backend = keras.backend.backend()
    if format in FORMATS and backend != "tensorflow":
        raise ValueError(
            f"{task}.export(format={format!r}) converts TensorFlow graphs of the decode step "
            f"(tf2onnx, LiteRT's converter): run it with KERAS_BACKEND=tensorflow. Received: "
            f"format={format!r} on backend {backend!r}")
    return format


def _name(path) -> str:
    """A state tensor's name from its path in the state's structure: `cache_0_1`."""
    return "_".join(str(p) for p in path)


def _state_layout(state) -> list[dict]:
    """`[{"name", "shape" (batch -1, other unknown sizes -1), "dtype"}]` of a state's flat
    tensors, in `keras.tree.flatten` order."""
    layout = []
    for path, tensor in keras.tree.flatten_with_path(state):
        shape = [-1] + [-1 if d is None else int(d) for d in tensor.shape[1:]]
        layout.append({"name": _name(path), "shape": shape,
                       "dtype": keras.backend.standardize_dtype(tensor.dtype)})
    return layout


def _specs(layout):
    import tensorflow as tf

    return [tf.TensorSpec([None if d < 0 else d for d in item["shape"]], item["dtype"],
                          name=item["name"]) for item in layout]


def decode_step_function(step, structure, layout):
    """A `tf.function` of one decode step over flat tensors, and its input signature:
    `(token_ids (B, 1), index, *state) -> {"logits": (B, V), <state name>_out: ...}`.

    Args:
        step: `(token_ids (B,), index, state) -> (logits, state, attention)`
            (`keras_attn.decoding.contract.step_function`).
        structure: the state (`init_decode_state`'s), whose structure the flat tensors
            fill.
        layout: `_state_layout(structure)`: the flat tensors' names, shapes and dtypes.
    """
    import tensorflow as tf

    names = [item["name"] for item in layout]

    def decode_step(token_ids, index, *flat):
        state = keras.tree.pack_sequence_as(structure, list(flat))
        logits, state, _ = step(token_ids[:, 0], index, state)
        outputs = {"logits": tf.cast(logits, tf.float32)}
        outputs.update({f"{n}_out": t for n, t in zip(names, keras.tree.flatten(state))})
        return outputs

    signature = [tf.TensorSpec([None, 1], tf.int32, name="token_ids"),
                 tf.TensorSpec([], tf.int32, name="index")] + _specs(layout)
    return tf.function(decode_step, input_signature=signature), signature


def _write(fn, signature, path: str, format: str, output_names: list[str], model) -> None:
    """Convert the `tf.function` `fn` (its outputs a dict) to `path` in `format`, the ONNX
    graph's outputs named `output_names` (tf2onnx names them `Identity:0`, ...), the LiteRT
    model with the one signature `serve` (its inputs named as in `signature`); `model`
    holds the variables (a layer or model without tokenizer tables, which LiteRT has not)."""
    import tensorflow as tf

    # The conversions' TensorFlow warnings (e.g. a SavedModel's lookup tables loaded earlier
    # in the process, which the frozen graph's collections cannot serialize) are not the
    # export's: errors only while converting.
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")
    try:
        _convert(fn, signature, path, format, output_names, model)
    finally:
        logger.setLevel(level)


def _convert(fn, signature, path: str, format: str, output_names: list[str], model) -> None:
    import tensorflow as tf

    with gathered_cache_writes():
        if format == "onnx":
            import tf2onnx

            proto, _ = tf2onnx.convert.from_function(fn, input_signature=signature,
                                                     opset=OPSET)
            _rename_outputs(proto, fn, signature, output_names)
            with open(path, "wb") as f:
                f.write(proto.SerializeToString())
            return
        # As Keras' LiteRT export: a SavedModel of the endpoint, then LiteRT's converter,
        # builtin ops only (ai-edge-litert's interpreter has no Flex delegate).
        with tempfile.TemporaryDirectory() as folder:
            archive = keras.export.ExportArchive()
            archive.track(model)
            archive.add_endpoint("serve", fn)
            archive.write_out(folder, verbose=False)
            converter = tf.lite.TFLiteConverter.from_saved_model(folder)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
            converter.experimental_enable_resource_variables = True
            tflite = converter.convert()
        with open(path, "wb") as f:
            f.write(tflite)


def _rename_outputs(proto, fn, signature, output_names) -> None:
    """Name the ONNX graph's outputs by the function's output keys (tf2onnx lists them in
    the order of the concrete function's flat outputs)."""
    concrete = fn.get_concrete_function(*signature)
    ordered = [path[0] for path, _ in keras.tree.flatten_with_path(concrete.structured_outputs)]
    if sorted(ordered) != sorted(output_names):  # pragma: no cover - a converter change
        raise ValueError(f"The decode step's outputs {ordered} are not {output_names}.")
    renames = dict(zip([o.name for o in proto.graph.output], ordered))
    for node in proto.graph.node:
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    for output in proto.graph.output:
        output.name = renames[output.name]


def _forward_function(model, max_length: int, format: str):
    """A `tf.function` of the task model's logits from `token_ids` and `padding_mask`
    (`(B, T)`, `T` dynamic for ONNX, `max_length` for LiteRT)."""
    import tensorflow as tf

    length = None if format == "onnx" else max_length
    signature = [tf.TensorSpec([None, length], tf.int32, name="token_ids"),
                 tf.TensorSpec([None, length], tf.bool, name="padding_mask")]

    def forward(token_ids, padding_mask):
        logits = model({"token_ids": token_ids, "padding_mask": padding_mask},
                       training=False)
        return {"logits": tf.cast(logits, tf.float32)}

    return tf.function(forward, input_signature=signature), signature


def _metadata(task: str, format: str, max_length: int, ids: dict, vocabulary_size: int,
              files: dict, layout: list[dict], initial_state: str) -> dict:
    names = [item["name"] for item in layout]
    return {
        "task": task, "format": format, "max_length": int(max_length),
        "vocabulary_size": int(vocabulary_size),
        "stop_token_ids": list(ids["stop_token_ids"] or ()), "pad_id": ids["pad_id"],
        "fill_id": ids["fill_id"], "bos_id": ids["bos_id"],
        "suppressed_ids": list(ids["suppressed_ids"]),
        "files": files, "state": layout, "initial_state": initial_state,
        "decode_step": {"inputs": ["token_ids", "index"] + names,
                        "outputs": ["logits"] + [f"{n}_out" for n in names]},
    }


def causal_lm_step(model, max_length: int):
    """The decode step of a causal LM over a cache of `max_length` positions as a
    `tf.function` (`decode_step_function`): `(fn, input_signature, state layout)`. Traced
    outside `gathered_cache_writes` it is the step `generate` runs (a slice update)."""
    from keras_attn.decoding import causal_lm, contract

    layer = causal_lm.decoder(model)
    structure = layer.init_decode_state(1, max_length)
    layout = _state_layout(structure)
    fn, signature = decode_step_function(contract.step_function(layer, False), structure,
                                         layout)
    return fn, signature, layout


def export_causal_lm(model, path: str, format: str, max_length: int, ids: dict) -> str:
    """Write `forward` and `decode_step` of a causal LM (module docstring) and `export.json`.

    Args:
        model: a `keras_attn.tasks.CausalLM` (inputs `token_ids`, `padding_mask`).
        path: str, a new or empty directory.
        format: `"onnx"` or `"litert"`.
        max_length: int, the cache's positions (prompt and generated tokens).
        ids: the special ids (`keras_attn.decoding.special_ids`).

    Returns:
        `path`.
    """
    from keras_attn.decoding import causal_lm, checks

    check_format("CausalLM", format, FORMATS)
    path = check_new_directory("path", path)
    check_int("max_length", max_length, 2)
    os.makedirs(path, exist_ok=True)
    files = {"forward": "forward" + SUFFIX[format], "decode_step": "decode_step" + SUFFIX[format]}
    layer = causal_lm.decoder(model)
    forward, signature = _forward_function(model, max_length, format)
    _write(forward, signature, os.path.join(path, files["forward"]), format, ["logits"], layer)
    step, signature, layout = causal_lm_step(model, max_length)
    meta = _metadata("causal_lm", format, max_length, ids, checks.vocabulary_size(layer),
                     files, layout, "zeros")
    _write(step, signature, os.path.join(path, files["decode_step"]), format,
           meta["decode_step"]["outputs"], layer)
    with open(os.path.join(path, METADATA), "w") as f:
        json.dump(meta, f, indent=1)
    return path


def _encoder_function(backbone, max_length: int):
    """A `tf.function` of the decoding state of `source_ids` `(B, S)`: the encoder, then the
    decoder's `init_decode_state` (outputs named `<state name>_out`), and that state's
    structure."""
    import tensorflow as tf

    from keras_attn.decoding import seq2seq

    encoder, decoder = seq2seq.decoder_parts(backbone)
    signature = [tf.TensorSpec([None, None], tf.int32, name="source_ids")]

    def init_state(source_ids):
        return decoder.init_decode_state(encoder(source_ids, training=False), source_ids,
                                         max_length)

    structure = tf.function(init_state, input_signature=signature).get_concrete_function(
        ).structured_outputs
    layout = _state_layout(structure)

    def encode(source_ids):
        state = keras.tree.flatten(init_state(source_ids))
        return {f"{item['name']}_out": t for item, t in zip(layout, state)}

    return tf.function(encode, input_signature=signature), signature, structure, layout


def export_seq2seq(backbone, path: str, format: str, max_length: int, ids: dict) -> str:
    """Write `encoder` and `decoder_step` of a sequence-to-sequence model (module docstring)
    and `export.json`.

    Args:
        backbone: a keras_attn sequence-to-sequence model (layers `"encoder"`, `"decoder"`).
        path: str, a new or empty directory.
        format: `"onnx"`.
        max_length: int, the output positions (`<bos>` excluded), the self-attention
            caches' length.
        ids: the special ids (`keras_attn.decoding.special_ids`).

    Returns:
        `path`.
    """
    from keras_attn.decoding import checks, contract, seq2seq

    check_format("Seq2SeqLM", format, ("onnx",))
    path = check_new_directory("path", path)
    check_int("max_length", max_length, 1)
    os.makedirs(path, exist_ok=True)
    _, decoder = seq2seq.decoder_parts(backbone)
    encode, signature, structure, layout = _encoder_function(backbone, max_length)
    files = {"encoder": "encoder" + SUFFIX[format],
             "decode_step": "decode_step" + SUFFIX[format]}
    meta = _metadata("seq2seq", format, max_length, ids, checks.vocabulary_size(decoder),
                     files, layout, "encoder")
    _write(encode, signature, os.path.join(path, files["encoder"]), format,
           [f"{item['name']}_out" for item in layout], backbone)
    step, signature = decode_step_function(contract.step_function(decoder, False), structure,
                                     layout)
    _write(step, signature, os.path.join(path, files["decode_step"]), format,
           meta["decode_step"]["outputs"], backbone)
    with open(os.path.join(path, METADATA), "w") as f:
        json.dump(meta, f, indent=1)
    return path
