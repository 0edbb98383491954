"""Keras' `model.export(path, format=...)` for models made of keras_attn layers, with what a
format's converter cannot take refused by name first.

Every layer exports with Keras' own `model.export` to `"onnx"`, `"litert"`, `"openvino"` and
(torch backend) `"torch"` (tests/test_export_formats.py, docs/exporting.md), except the
recurrent layers to LiteRT and OpenVINO and `LinearAttention` to ONNX: there
`export(model, path, format)` raises a `ValueError` naming the layer, the format and the way
around it, where `model.export` ends in the converter's or the runtime's error.
"""

from __future__ import annotations

import keras

from keras_attn.layers.linear_attention import LinearAttention

FORMATS = ("tf_saved_model", "onnx", "litert", "openvino", "torch")

# (format, the layers it cannot take, why and the way around it).
_REFUSED = (
    ("onnx", (LinearAttention,),
     ("tf2onnx (1.17) converts the chunked prefix sums of linear attention (the sequence "
      "padded to a multiple of `chunk_size`, then cut back) into a graph that onnxruntime "
      "cannot run (a Reshape of a wrongly sized tensor). Export with format=\"openvino\" or "
      "format=\"litert\" instead, which run it as `predict` does")),
    ("litert", (keras.layers.RNN,),
     ("LiteRT has no builtin TensorList (the loop of Keras' recurrent layers: "
      "`keras.layers.GRU` and `RNN`, the Bahdanau encoder and decoder), so the converted model "
      "needs TensorFlow's Flex delegate, which ai-edge-litert's interpreter does not have. "
      "Export with format=\"onnx\" (onnxruntime) instead")),
    ("openvino", (keras.layers.RNN,),
     ("OpenVINO's TensorFlow frontend converts no TensorList (the loop of Keras' recurrent "
     "layers: `keras.layers.GRU` and `RNN`, the Bahdanau encoder and decoder), nor the ONNX "
     "`Loop` that tf2onnx writes for it. Export with format=\"onnx\" (onnxruntime) "
     "instead")),
)


def unexportable(model: keras.Model, format: str) -> str | None:
    """Why `model` does not export to `format`, naming the first layer it cannot take, or
    None where it exports. The refusals concern the converters of TensorFlow graphs (tf2onnx,
    LiteRT's, OpenVINO's TensorFlow frontend), which Keras uses on TensorFlow and JAX; on
    torch Keras traces with torch and nothing is refused."""
    if keras.backend.backend() == "torch":
        return None
    for refused_format, classes, why in _REFUSED:
        if format != refused_format:
            continue
        for layer in model.layers:
            inner = [sub for sub in layer._flatten_layers(include_self=True, recursive=True)
                     if isinstance(sub, classes)]
            if inner:
                return (f"Layer {layer.name!r} ({type(layer).__name__}, through its "
                        f"{type(inner[0]).__name__} {inner[0].name!r}) does not export to "
                        f"format={format!r}: {why}.")
    return None


def export(model: keras.Model, filepath: str, format: str = "tf_saved_model",
           **kwargs) -> str:
    """`model.export(filepath, format=format, **kwargs)`, after refusing what the format's
    converter cannot take.

    Args:
        model: a built `keras.Model`.
        filepath: str, where Keras writes the export (`.onnx`, `.tflite`, `.xml`, `.pt2`, or a
            SavedModel directory).
        format: one of `FORMATS`. Defaults to `"tf_saved_model"`.
        **kwargs: Keras' `export` arguments (`verbose`, `input_signature`, ...).

    Returns:
        `filepath`.

    Raises:
        ValueError: an unknown `format`, or a layer the format cannot take (named, with the
            way around it).
    """
    if format not in FORMATS:
        raise ValueError(f"Received an invalid value for argument `format`, expected one of "
                         f"{FORMATS}. Received: format={format!r}")
    reason = unexportable(model, format)
    if reason:
        raise ValueError(reason)
    model.export(filepath, format=format, **kwargs)
    return filepath
