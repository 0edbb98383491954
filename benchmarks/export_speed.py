"""Forward-pass speed of a model exported with Keras' `model.export` to ONNX, LiteRT and
OpenVINO, each in its own runtime, against TensorFlow's (the model's call in a `tf.function`,
what a SavedModel serves), side by side in one process on this CPU.

The models: `causal_lm` (2 pre-norm blocks, RoPE, grouped-query heads, SwiGLU; d=128,
vocabulary 1000) and `transformer_seq2seq` (1 + 1 post-norm blocks, d=128), float32, batch
`--batch` of `--length` tokens. Every runtime's outputs are checked against `predict` first.
Reports the median milliseconds per call over `--rounds` alternating rounds
(`_common.time_alternating`) and the ratio to TensorFlow's median (below 1: faster).

Then the one-token decode step of the `causal_lm` exported by `CausalLM.export(path,
format="onnx" | "litert")` (a cache of `--length` positions, the token at position
`--length // 2`), in onnxruntime and LiteRT's interpreter against TensorFlow's cached step (the
`tf.function` of the step `generate` runs, its cache written by a slice update): milliseconds
per token for the batch, each runtime's logits and caches checked against TensorFlow's first.

    python benchmarks/export_speed.py [--batch 8] [--length 128] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile

import _common


def runners(model, inputs, folder: str) -> dict:
    """name -> a function running `inputs` through that runtime, after checking its outputs."""
    import numpy as np
    import onnxruntime
    import openvino
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    names = [t.name for t in model.inputs]
    expected = model.predict(inputs if len(inputs) > 1 else inputs[0], verbose=0)
    paths = {fmt: os.path.join(folder, model.name + suffix)
             for fmt, suffix in (("onnx", ".onnx"), ("litert", ".tflite"),
                                 ("openvino", ".xml"))}
    for fmt, path in paths.items():
        model.export(path, format=fmt, verbose=False)

    serve = tf.function(lambda *x: model(list(x) if len(x) > 1 else x[0], training=False))
    tensors = [tf.constant(a) for a in inputs]
    session = onnxruntime.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    onnx_feed = dict(zip([i.name for i in session.get_inputs()], inputs))
    litert = Interpreter(model_path=paths["litert"]).get_signature_runner()
    litert_feed = dict(zip(names, inputs))
    compiled = openvino.Core().compile_model(paths["openvino"], "CPU",
                                             {"INFERENCE_PRECISION_HINT": "f32"})
    (output,) = [o for o in compiled.outputs
                 if any(re.fullmatch(r"Identity:0", n) for n in o.get_names())]
    request = compiled.create_infer_request()
    ov_feed = dict(zip(names, inputs))

    fns = {
        "tensorflow": lambda: serve(*tensors).numpy(),
        "onnxruntime": lambda: session.run(None, onnx_feed)[0],
        "litert": lambda: litert(**litert_feed)["output_0"],
        "openvino": lambda: request.infer(ov_feed)[output],
    }
    for name, fn in fns.items():
        error = float(np.max(np.abs(np.asarray(fn()) - expected)))
        print(f"  {model.name} {name}: max |out - predict| = {error:.1e}")
    return fns


def decode_step_runners(model, batch: int, length: int, folder: str) -> dict:
    """name -> a function running one decode step of `model` (a `causal_lm`) at position
    `length // 2` of a random cache, in TensorFlow, onnxruntime and LiteRT, after checking
    the exported steps' outputs against TensorFlow's."""
    import numpy as np
    import tensorflow as tf

    from keras_attn import export_steps
    from keras_attn.export_decoding import causal_lm_step
    from keras_attn.tasks import CausalLM

    lm = CausalLM(model)
    step, _, layout = causal_lm_step(lm, length)  # traced here: the slice update
    rng = np.random.default_rng(1)
    feed = {"token_ids": rng.integers(4, 1000, (batch, 1)).astype("int32"),
            "index": np.asarray(length // 2, "int32")}
    feed.update({item["name"]: rng.normal(size=[batch] + item["shape"][1:]).astype("float32")
                 for item in layout})
    tensors = [tf.constant(v) for v in feed.values()]
    expected = {name: value.numpy() for name, value in step(*tensors).items()}
    fns = {"tensorflow": lambda: step(*tensors)["logits"].numpy()}
    for fmt, name in (("onnx", "onnxruntime"), ("litert", "litert")):
        path = lm.export(os.path.join(folder, f"lm_{fmt}"), max_length=length, format=fmt)
        _, runners = export_steps.load(path)
        runner = runners["decode_step"]
        outputs = runner(feed)
        error = max(float(np.max(np.abs(np.asarray(outputs[key]) - value)))
                    for key, value in expected.items())
        print(f"  decode step {name}: max |out - TensorFlow's| = {error:.1e}")
        fns[name] = lambda runner=runner: runner(feed)["logits"]
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    _common.header("export_speed: forward pass of exported models, per runtime")
    import keras
    import numpy as np

    from keras_attn.models import causal_lm, transformer_seq2seq

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 1000, (args.batch, args.length)).astype("int32")
    models = [
        (causal_lm(1000, num_layers=2, hidden_dim=128, num_heads=4, intermediate_dim=512,
                   num_key_value_heads=2), [ids]),
        (transformer_seq2seq(1000, 1000, num_layers=1, hidden_dim=128, num_heads=4,
                             intermediate_dim=512, dropout=0.0), [ids, ids]),
    ]
    print(f"batch {args.batch} x {args.length} tokens, float32, {args.rounds} rounds")
    with tempfile.TemporaryDirectory() as folder:
        for model, inputs in models:
            fns = runners(model, inputs, folder)
            times = _common.time_alternating(fns, args.rounds, warmup=2)
            base = _common.median(times["tensorflow"])
            print(f"| {model.name} | runtime | median ms | / TensorFlow |")
            for name, values in times.items():
                ms = 1000 * _common.median(values)
                print(f"| {model.name} | {name} | {ms:.2f} | {_common.median(values) / base:.2f} |")
        decoder = models[0][0]
        fns = decode_step_runners(decoder, args.batch, args.length, folder)
        times = _common.time_alternating(fns, args.rounds * 4, warmup=3)
        base = _common.median(times["tensorflow"])
        print(f"| decode step (batch {args.batch}, cache {args.length}) | runtime | "
              "median ms per token | / TensorFlow |")
        for name, values in times.items():
            ms = 1000 * _common.median(values)
            print(f"| decode step | {name} | {ms:.3f} | {_common.median(values) / base:.2f} |")


if __name__ == "__main__":
    main()
