"""Where an epoch of English-French training goes: padding, input pipeline, and the step's parts.

Loads `--data` as `examples/transformer_translation.py --data` does and builds its model (its
defaults, or the flags in `--example-args`), then, for batches padded to the longest sentence
allowed and for length-grouped batches (`TranslationData.make_dataset(group_by_length=True)`):

- padding share: the fraction of the batches' source and target positions that are padding;
- input pipeline: seconds to produce one epoch of batches with no model;
- step: mean wall time of `model.fit` over `--steps` batches drawn at random from the epoch
  (fed from memory), times the epoch's batches = the epoch's compute;
- parts of a step: op time under the TensorFlow profiler, summed over threads, sorted into
  the vocabulary projection with its softmax cross-entropy, attention (scores, softmax,
  weighted values and the Q/K/V/output projections), feed-forward networks, the optimizer
  update (Adam with gradient clipping), and the rest (embeddings, layer norms, dropout,
  residuals, masks); forward and backward together.

    python benchmarks/translation_profile.py
    python benchmarks/translation_profile.py --example-args "--embed-dim 256 --num-heads 8"
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import shutil
import tempfile
import time

from _common import example_module, header
from profile_step import op_times

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data", "fra-eng.txt")

# First match wins: op names carry the layer path, gradient ops included ("gradient_tape/...").
PARTS = (
    ("optimizer update", ("adam", "clip_by", "global_norm", "assignaddvariableop",
                          "resourceapply")),
    ("vocabulary projection + loss", ("output_dense", "loss", "sparsesoftmax",
                                      "logsoftmax", "crossentropy")),
    ("attention", ("attention",)),
    ("feed-forward", ("ffn",)),
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DATA, help="(default: %(default)s)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per batching")
    parser.add_argument("--profiled-steps", type=int, default=5)
    parser.add_argument("--example-args", default="",
                        help="flags of the example, e.g. \"--embed-dim 256 --batch-size 64\"")
    return parser.parse_args(argv)


def op_times_by_part(logdir: str, steps: int) -> collections.Counter:
    """ms per step by part of the step (`PARTS`), and by op type within the rest ("rest: T")."""
    def keys(name, op_type):
        lowered = name.lower()
        part = next((part for part, words in PARTS if any(w in lowered for w in words)), "rest")
        return (part, "rest: " + op_type) if part == "rest" else (part,)

    return op_times(logdir, steps, keys)


def padding_share(batches) -> float:
    import numpy as np

    positions = real = 0
    for (source, target_in), _ in batches:
        positions += source.size + target_in.size
        real += int(np.count_nonzero(source)) + int(np.count_nonzero(target_in))
    return 1 - real / positions


def main(argv=None) -> None:
    own = parse_args(argv)
    if not os.path.exists(own.data):
        raise SystemExit(f"no data at {own.data}: pass --data fra-eng.txt")
    example_module("example_utils").import_tensorflow_quietly()
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_attn.recipes.translation import compile_translator, load_data

    example = example_module("transformer_translation")
    DEFAULTS, MODEL_FLAGS, build_model = example.DEFAULTS, example.MODEL_FLAGS, example.build_model
    example_args = example_module("translation_args").parse_args
    args = example_args("profile", DEFAULTS, ["--data", own.data, "--out", tempfile.mkdtemp(),
                                              *shlex.split(own.example_args)], MODEL_FLAGS)
    header("One epoch of English-French training: where the time goes")
    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)
    data = load_data(args)
    options = {key: getattr(args, key) for key in (*args.model_options, "batch_size",
                                                   "precision")}
    print(f"{len(data.train)} training pairs; {options}")
    spec = tf.TensorSpec((None, None), tf.int32)

    def feed(part):
        return tf.data.Dataset.from_generator(lambda: iter(part),
                                              output_signature=((spec, spec), spec))

    rows = {}
    for label, grouped in (("padded to the longest allowed", False), ("grouped by length", True)):
        dataset = data.make_dataset("train", args.batch_size, shuffle=True, seed=args.seed,
                                    group_by_length=grouped)
        start = time.perf_counter()
        batches = [(tuple(x.numpy() for x in inputs), target.numpy())
                   for inputs, target in dataset]
        pipeline = time.perf_counter() - start
        model = build_model(data, args)
        compile_translator(model, args, len(batches))
        # A seeded sample of the epoch's batches (partial ones included), fed from memory with
        # unknown lengths: model.fit traces its step once, as in training, and no shuffle
        # buffer is refilled inside the timing.
        rng = np.random.default_rng(args.seed)
        sample = [batches[i] for i in rng.choice(len(batches), own.steps + 5, replace=False)]
        model.fit(feed(sample[:5]), verbose=0)
        start = time.perf_counter()
        model.fit(feed(sample[5:]), verbose=0)
        step = (time.perf_counter() - start) / own.steps
        logdir = tempfile.mkdtemp(prefix="translation_profile_")
        try:
            tf.profiler.experimental.start(logdir)
            model.fit(feed(sample[5:5 + own.profiled_steps]), verbose=0)
            tf.profiler.experimental.stop()
            parts = op_times_by_part(logdir, own.profiled_steps)
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
        rows[label] = {"padding": padding_share(batches), "pipeline": pipeline,
                       "batches": len(batches), "step": step, "parts": parts}
    names = [part for part, _ in PARTS] + ["rest"]
    print("| batching | padding share | input pipeline (s/epoch) | batches | step (ms) | "
          "compute (s/epoch) | " + " | ".join(names) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(names))
    for label, r in rows.items():
        total = sum(r["parts"][n] for n in names)
        shares = " | ".join(f"{100 * r['parts'][n] / total:.0f}%" for n in names)
        print(f"| {label} | {100 * r['padding']:.0f}% | {r['pipeline']:.1f} | {r['batches']} | "
              f"{1e3 * r['step']:.0f} | {r['step'] * r['batches']:.0f} | {shares} |")
    for label, r in rows.items():
        rest = sorted(((k[6:], v) for k, v in r["parts"].items() if k.startswith("rest: ")),
                      key=lambda item: -item[1])[:6]
        print(f"{label}, largest op types of the rest: "
              + ", ".join(f"{name} {v:.1f} ms" for name, v in rest))
    fixed, grouped = rows.values()
    speedup = fixed["step"] * fixed["batches"] / (grouped["step"] * grouped["batches"])
    print(f"grouping by length: an epoch's compute x{speedup:.2f} faster")


if __name__ == "__main__":
    main()
