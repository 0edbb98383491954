"""Keras' own `model.export(path, format=...)` on a functional model of each layer family, run
in the format's own runtime (onnxruntime, ai-edge-litert's interpreter, OpenVINO, and on the
torch backend `torch.export.load`) and compared with `predict` in float32. ONNX and OpenVINO
keep the batch and sequence sizes dynamic: two other shapes are run there too.

Each family's model, its inputs and `predict`'s outputs are built once per module, and each
(family, format) is exported once; the fast part covers every format on the families whose
code paths differ most (masks, windows, the task models with grouped-query heads and RoPE),
the rest is `slow`."""

from __future__ import annotations

import importlib.util
import re

import keras
import numpy as np
import pytest

import keras_attn as ka
from keras_attn import export_formats
from keras_attn.layers import AttentionConfig
from keras_attn.models import bahdanau_seq2seq, causal_lm, transformer_seq2seq

BACKEND = keras.backend.backend()
D = 16  # model size of the layer families

# Largest absolute difference from `predict`, float32, outputs of order 1. Measured maxima
# over every family (2026-12-07): ONNX 1.1e-6, LiteRT 1.2e-6, OpenVINO 1.2e-6 (with float32
# inference, `run_openvino`), torch.export 2.1e-9; the bounds leave a factor of about 100.
TOLERANCE = {"onnx": 1e-4, "litert": 1e-4, "openvino": 1e-4, "torch": 1e-6}
SUFFIX = {"onnx": ".onnx", "litert": ".tflite", "openvino": ".xml", "torch": ".pt2"}
RUNTIME = {"onnx": "onnxruntime", "litert": "ai_edge_litert", "openvino": "openvino",
           "torch": "torch"}
# What the converter needs besides the runtime (Keras' ONNX export on TensorFlow: tf2onnx).
CONVERTER = {"onnx": "tf2onnx", "litert": None, "openvino": None, "torch": None}


def _input(shape, name, dtype="float32"):
    return keras.Input(shape=shape, dtype=dtype, name=name)


def _padding_mask(tokens):
    return keras.ops.not_equal(tokens, 0)  # (B, S), True = a token


def nw_pooling():
    query, keys, values = (_input((None,), n) for n in ("x_query", "x_train", "y_train"))
    return keras.Model([query, keys, values], ka.NWPooling(learnable=True)(query, keys, values))


def additive():
    query, key = _input((None, D), "query"), _input((None, D), "key")
    tokens = _input((None,), "key_tokens", "int32")
    out = ka.AdditiveAttention(8)(query, key, key, key_mask=_padding_mask(tokens))
    return keras.Model([query, key, tokens], out)


def scaled_dot():
    query, key = _input((None, D), "query"), _input((None, D), "key")
    return keras.Model([query, key], ka.ScaledDotAttention()(query, key, key,
                                                             use_causal_mask=True))


def multi_head():
    x, tokens = _input((None, D), "x"), _input((None,), "tokens", "int32")
    out = ka.MultiHead(2, 8)(x, key_mask=_padding_mask(tokens), use_causal_mask=True)
    return keras.Model([x, tokens], out)


def gqa_rope():
    x = _input((None, D), "x")
    out = ka.MultiHead(4, 4, num_key_value_heads=2, position_encoding="rope")(
        x, use_causal_mask=True)
    return keras.Model(x, out)


def position_bias():
    x = _input((None, D), "x")
    alibi = ka.MultiHead(2, 8, position_encoding="alibi")(x, use_causal_mask=True)
    t5 = ka.MultiHead(2, 8, position_encoding="relative")(x)
    return keras.Model(x, [alibi, t5])


def linear_local():
    x = _input((None, D), "x")
    linear = ka.LinearAttention(2, 8)(x, use_causal_mask=True)
    local = ka.LocalMultiHead(2, 8, sliding_window=3)(x)
    return keras.Model(x, [linear, local])


def swin():
    images = _input((8, 8, 3), "images")
    grid = ka.PatchEmbedding(2, D)(images)  # (B, 4, 4, D)
    return keras.Model(images, ka.SwinBlock(2, 2, shift_size=1)(grid))


def blocks():
    source, target = _input((None, D), "source"), _input((None, D), "target")
    tokens = _input((None,), "source_tokens", "int32")
    mask = _padding_mask(tokens)
    encoded = ka.TransformerEncoderBlock(AttentionConfig(2), 32)(source, padding_mask=mask)
    out = ka.TransformerDecoderBlock(AttentionConfig(2), 32)(target, encoded,
                                                             encoder_padding_mask=mask)
    return keras.Model([source, target, tokens], out)


def bahdanau():
    return bahdanau_seq2seq(20, 21, embedding_dim=8, units=8, num_layers=1, dropout=0.0)


def language_model():
    return causal_lm(40, num_layers=1, hidden_dim=D, num_heads=2, intermediate_dim=32,
                     num_key_value_heads=1)


def seq2seq():
    return transformer_seq2seq(30, 31, num_layers=1, hidden_dim=D, num_heads=2,
                               intermediate_dim=32, dropout=0.0)


FAMILIES = {"nw_pooling": nw_pooling, "additive": additive, "scaled_dot": scaled_dot,
            "multi_head": multi_head, "gqa_rope": gqa_rope, "position_bias": position_bias,
            "linear_local": linear_local, "swin": swin, "blocks": blocks,
            "bahdanau_seq2seq": bahdanau, "causal_lm": language_model,
            "transformer_seq2seq": seq2seq}
# causal_lm has grouped-query heads with RoPE too (gqa_rope, slow, has them alone).
FAST = ("multi_head", "swin", "causal_lm", "transformer_seq2seq")
# (family, format) that Keras' converter cannot take, and why (`check_refused` below).
REFUSED = {("bahdanau_seq2seq", "openvino"), ("bahdanau_seq2seq", "litert"),
           ("linear_local", "onnx")}


def family_params():
    return [pytest.param(name, marks=() if name in FAST else pytest.mark.slow, id=name)
            for name in FAMILIES]


def make_inputs(model, batch: int, length: int, seed: int = 0) -> list[np.ndarray]:
    """Random inputs of the model's inputs at `(batch, length)`: floats, or token ids with
    padding (0) at the end of the second row, so every padding mask masks something."""
    rng = np.random.default_rng(seed)
    arrays = []
    for tensor in model.inputs:
        shape = [batch] + [length if size is None else size for size in tensor.shape[1:]]
        if "int" in str(tensor.dtype):
            ids = rng.integers(4, 20, shape).astype("int32")
            ids[min(1, batch - 1), length - 2:] = 0
            arrays.append(ids)
        else:
            arrays.append(rng.normal(size=shape).astype("float32"))
    return arrays


def as_list(outputs) -> list[np.ndarray]:
    return [np.asarray(o) for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


def run_onnx(path, model, inputs):
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert len(names) == len(inputs)
    feed = dict(zip([t.name for t in model.inputs], inputs))
    return session.run(None, {name: feed.get(name, inputs[k]) for k, name in enumerate(names)})


def run_litert(path, model, inputs):
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path).get_signature_runner()
    outputs = runner(**dict(zip([t.name for t in model.inputs], inputs)))
    return [outputs[f"output_{k}"] for k in range(len(outputs))]


def run_openvino(path, model, inputs):
    import openvino

    # float32 throughout: OpenVINO's CPU plugin computes in bfloat16 where the CPU has it.
    compiled = openvino.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(dict(zip([t.name for t in model.inputs], inputs)))
    # The model's outputs are the traced function's `Identity`, `Identity_1`, ...; OpenVINO's
    # TensorFlow frontend also returns shape computations nothing consumes (scalars).
    named = {}
    for output in compiled.outputs:
        for name in output.get_names():
            match = re.fullmatch(r"Identity(?:_(\d+))?:0", name)
            if match:
                named[int(match.group(1) or 0)] = results[output]
    return [named[k] for k in sorted(named)]


def run_torch(path, model, inputs):
    import torch

    module = torch.export.load(path).module()
    tensors = [torch.from_numpy(a) for a in inputs]
    with torch.no_grad():
        outputs = module(tensors if len(tensors) > 1 else tensors[0])
    return [o.numpy() for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


RUN = {"onnx": run_onnx, "litert": run_litert, "openvino": run_openvino, "torch": run_torch}


def needs(fmt: str) -> None:
    """Skips when the runtime (or converter) of `fmt` is not installed; the test extra
    installs every one (CI fails when an install fails)."""
    for package in (RUNTIME[fmt], CONVERTER[fmt]):
        if package and importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install -e '.[export]')")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="module", params=family_params())
def family(request, export_dir):
    """One family's model, its inputs at (2, 5) and `predict`'s outputs, and its exports
    (written once per format, on first use)."""
    keras.utils.set_random_seed(1234)
    model = FAMILIES[request.param]()
    inputs = make_inputs(model, 2, 5)
    return {"name": request.param, "model": model, "inputs": inputs,
            "expected": as_list(model.predict(inputs, verbose=0)), "paths": {}}


def exported(family, fmt: str, export_dir) -> str:
    if fmt not in family["paths"]:
        path = str(export_dir / f"{family['name']}{SUFFIX[fmt]}")
        kwargs = {}
        if fmt == "torch":  # a program of the traced shape: the family's inputs' own
            specs = [keras.InputSpec(shape=a.shape, dtype=str(a.dtype))
                     for a in family["inputs"]]
            kwargs["input_signature"] = [specs] if len(specs) > 1 else specs
        family["model"].export(path, format=fmt, verbose=False, **kwargs)
        family["paths"][fmt] = path
    return family["paths"][fmt]


def check_same(outputs, expected, fmt: str) -> None:
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected):
        assert out.shape == ref.shape and out.dtype == np.float32
        np.testing.assert_allclose(out, ref, rtol=0, atol=TOLERANCE[fmt])


@pytest.mark.tf_only  # the converters read TensorFlow graphs (LiteRT: TensorFlow only)
@pytest.mark.parametrize("fmt", ["onnx", "litert", "openvino"])
def test_export_runs_in_the_formats_runtime_as_predict(family, fmt, export_dir):
    needs(fmt)
    if (family["name"], fmt) in REFUSED:
        pytest.skip("refused: test_what_does_not_convert_is_refused_by_name")
    path = exported(family, fmt, export_dir)
    check_same(as_list(RUN[fmt](path, family["model"], family["inputs"])),
               family["expected"], fmt)


@pytest.mark.tf_only
@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_batch_and_length_stay_dynamic(family, fmt, export_dir):
    needs(fmt)
    if (family["name"], fmt) in REFUSED:
        pytest.skip("refused: test_what_does_not_convert_is_refused_by_name")
    path = exported(family, fmt, export_dir)
    model = family["model"]
    for batch, length in ((1, 3), (3, 9)):  # neither is (2, 5)
        inputs = make_inputs(model, batch, length, seed=batch)
        check_same(as_list(RUN[fmt](path, model, inputs)),
                   as_list(model.predict(inputs, verbose=0)), fmt)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.export needs the torch backend")
def test_torch_export_loads_and_runs_as_predict(family, export_dir):
    path = exported(family, "torch", export_dir)
    check_same(as_list(RUN["torch"](path, family["model"], family["inputs"])),
               family["expected"], "torch")


@pytest.mark.tf_only
def test_what_does_not_convert_is_refused_by_name(tmp_path):
    """The Bahdanau stacks' GRUs (Keras' recurrent loop) convert to neither OpenVINO nor
    LiteRT's builtin ops: the
    exporter names the layer, the format and the way around it, and writes nothing."""
    model = bahdanau()
    path = str(tmp_path / "bahdanau.xml")
    with pytest.raises(ValueError, match=r"Layer 'encoder' \(BahdanauEncoder, through its GRU "
                                         r".*format='openvino'.*format=\"onnx\""):
        export_formats.export(model, path, format="openvino")
    with pytest.raises(ValueError, match=r"Layer 'encoder'.*format='litert'.*Flex"):
        export_formats.export(model, str(tmp_path / "bahdanau.tflite"), format="litert")
    assert export_formats.unexportable(model, "onnx") is None
    linear = linear_local()
    with pytest.raises(ValueError, match=r"Layer 'linear_attention.*format='onnx'.*openvino"):
        export_formats.export(linear, str(tmp_path / "linear.onnx"), format="onnx")
    assert export_formats.unexportable(linear, "openvino") is None
    with pytest.raises(ValueError, match="argument `format`"):
        export_formats.export(model, str(tmp_path / "bahdanau.onnnx"), format="onnnx")
    assert not list(tmp_path.iterdir())
