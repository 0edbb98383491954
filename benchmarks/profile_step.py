"""Where a Transformer training step spends its time, op type by op type, float32 and bfloat16.

Builds the models of `bf16_training.py` (same flags), runs a few `train_on_batch` steps under
the TensorFlow profiler and sums the recorded op times by op type (`_MklMatMul`,
`StatelessRandomUniformV2`, `Cast`, ...), per step, for each policy. Op times are summed over
the threads that ran them, so a column can exceed the step's wall time; compare the columns,
not the totals with the step time. This is how the two bfloat16 costs of RESULTS.md (dropout's
random numbers, the float32 vocabulary projection) were found.

    python benchmarks/profile_step.py
    python benchmarks/profile_step.py --dim 512 --ffn 2048 --top 25

`--lm T` profiles instead the two contenders of `lm_training_speed.py` at length `T` (its
flags after `--`), keras_attn's `causal_lm` and keras-hub's `GPT2CausalLM`, profiled in
alternating steps, and sums the op time of each by model part (loss, metrics, optimizer,
tied head, embeddings, attention projections, attention core, FFN, norms), forward and
backward together (a gradient op counts for the part it differentiates):

    python benchmarks/profile_step.py --lm 128 --steps 6
    python benchmarks/profile_step.py --lm 1024 --steps 6 -- --rounds 1
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import tempfile
import time

from _common import header
from bf16_training import build, synthetic_batch
from bf16_training import parse_args as bf16_args

# Model parts of a language model's training step, by op name (keras_attn's and keras-hub's
# layer names; gradient ops carry the forward op's name): the first pattern that matches wins.
PARTS = (
    ("loss", r"loss"),
    ("metrics", r"metric|accuracy"),
    ("optimizer", r"adam|Adam|optimizer"),
    ("tied head (x E^T)", r"(head|gpt2_causal_lm)/token_embedding"),
    ("norms", r"_norm/|layer_norm/|_norm$|layer_norm_grad/"),
    ("embeddings", r"embedding|embeddings_add"),
    ("attention projections",
     (r"self_attention/(query|key|value|output)(_dense)?/|self_attention/attention_output/"
      r"|self_attention/(Tensordot|add(_\d+)?$|add/)")),
    ("attention core (scores, softmax, mask, weighted sum)", r"self_attention"),
    # keras_attn.ops.fused's backward ops carry their own scope, not the layer's.
    ("FFN", r"ffn|feedforward_(intermediate|output)|gelu_tanh_grad/"),
)


def parse_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per policy")
    parser.add_argument("--top", type=int, default=20, help="op types to list")
    parser.add_argument("--lm", type=int, default=None, metavar="T",
                        help="profile lm_training_speed.py's two models at length T")
    own, rest = parser.parse_known_args(argv)
    if own.lm is not None:
        from lm_training_speed import parse_args as lm_args

        return own, lm_args([a for a in rest if a != "--"])
    return own, bf16_args(rest)


# Ops of a custom gradient's backward function carry no layer scope in TensorFlow's graph
# ("MatMul_3", "ArithmeticOptimizer/FoldTransposeIntoMatMul_MatMul_1"): in keras_attn's step
# those are the dense attention kernel's fused backward.
UNSCOPED_ATTENTION_OPS = ("_MklBatchMatMulV2", "_MklTranspose", "Mul", "Sub", "SelectV2",
                          "ConcatV2", "Sum", "Cast", "Exp")


def part_of(name: str, op_type: str = "") -> str:
    """The model part (`PARTS`) an op belongs to, by its name (and type, for unscoped ops)."""
    name = re.sub(r"_\d+(?=/|$)", "", name)  # Keras' call-count suffixes: "head_1" -> "head"
    if "/" not in name.replace("ArithmeticOptimizer/", "") and op_type in UNSCOPED_ATTENTION_OPS:
        return "attention core (scores, softmax, mask, weighted sum)"
    for part, pattern in PARTS:
        if re.search(pattern, name):
            return part
    return "other (casts, reshapes, residual adds, bookkeeping)"


def profile_lm(own, args) -> None:
    """Op time per model part of both language-model steps, side by side."""
    import numpy as np
    import tensorflow as tf
    from lm_training_speed import models

    length = own.lm
    batch = max(1, args.tokens // length)
    header(f"Language-model training step by model part: causal_lm vs GPT2CausalLM, T={length}")
    ids = np.random.default_rng(0).integers(1, args.vocab_size, (batch, length + 1))
    x, y = ids[:, :-1].astype("int32"), ids[:, 1:].astype("int32")
    ours, hub = models(length, args)
    steps = {"keras_attn": lambda: ours.train_on_batch(x, y),
             "keras_hub": lambda: hub.train_on_batch(
                 {"token_ids": x, "padding_mask": np.ones_like(x, dtype="bool")}, y)}
    for step in list(steps.values()) * 3:
        step()
    walls = {name: 0.0 for name in steps}
    totals = {name: collections.Counter() for name in steps}
    for _ in range(own.steps):  # alternate, one profiled step at a time
        for name, step in steps.items():
            logdir = tempfile.mkdtemp(prefix="profile_lm_")
            try:
                tf.profiler.experimental.start(logdir)
                start = time.perf_counter()
                step()
                walls[name] += (time.perf_counter() - start) / own.steps
                tf.profiler.experimental.stop()
                totals[name] += op_times(logdir, own.steps,
                                         keys=lambda op, kind: (
                                             part_of(op.rsplit(":", 1)[0], kind),))
            finally:
                shutil.rmtree(logdir, ignore_errors=True)
    print(f"batch {batch}, {own.steps} profiled steps each, alternating; op time per step in "
          "ms (summed over threads), share of each model's op time")
    print(f"profiled step wall time: keras_attn {walls['keras_attn'] * 1e3:.1f} ms, keras-hub "
          f"{walls['keras_hub'] * 1e3:.1f} ms")
    print("| part | keras_attn ms | share | keras-hub ms | share | keras_attn / keras-hub |")
    print("|---|---|---|---|---|---|")
    ours_t, hub_t = totals["keras_attn"], totals["keras_hub"]
    ours_sum, hub_sum = sum(ours_t.values()), sum(hub_t.values())
    for part in sorted(set(ours_t) | set(hub_t), key=lambda k: -(ours_t[k] + hub_t[k])):
        ratio = f"{ours_t[part] / hub_t[part]:.2f}" if hub_t[part] else "-"
        print(f"| {part} | {ours_t[part]:.1f} | {100 * ours_t[part] / ours_sum:.0f}% | "
              f"{hub_t[part]:.1f} | {100 * hub_t[part] / hub_sum:.0f}% | {ratio} |")
    print(f"| all ops | {ours_sum:.1f} | | {hub_sum:.1f} | | {ours_sum / hub_sum:.2f} |")


def op_times(logdir: str, steps: int, keys=lambda name, op_type: (op_type,)
             ) -> collections.Counter:
    """ms per step by op type, from the profiler's XPlane file.

    `keys(op_name, op_type)` gives the keys an op's time is added to (default: its type).
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    totals = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                # TensorFlow op events are named "op_name:OpType"; skip function wrappers.
                if ":" not in name or name.startswith(("$", " ", "__inference")):
                    continue
                op_type = name.rsplit(":", 1)[1]
                if op_type not in ("Run", "Process") and "__inference" not in op_type:
                    for key in keys(name, op_type):
                        totals[key] += event.duration_ps / 1e9 / steps
    return totals


def main(argv=None) -> None:
    import tensorflow as tf

    own, args = parse_args(argv)
    if own.lm is not None:
        profile_lm(own, args)
        return
    header("Transformer training step, op time by type: float32 vs mixed_bfloat16")
    print(f"d={args.dim}, heads={args.heads}, ffn={args.ffn}, layers={args.layers}+{args.layers}"
          f", batch={args.batch}, length={args.length}, dropout={args.dropout}; "
          f"{own.steps} profiled steps per policy")
    x, y = synthetic_batch(args)
    results = {}
    for policy in ("float32", "mixed_bfloat16"):
        model = build(policy, args)
        for _ in range(3):
            model.train_on_batch(x, y)
        start = time.perf_counter()
        for _ in range(3):
            model.train_on_batch(x, y)
        step_ms = (time.perf_counter() - start) / 3 * 1e3
        logdir = tempfile.mkdtemp(prefix="profile_step_")
        try:
            tf.profiler.experimental.start(logdir)
            for _ in range(own.steps):
                model.train_on_batch(x, y)
            tf.profiler.experimental.stop()
            results[policy] = (step_ms, op_times(logdir, own.steps))
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
    (t32, ops32), (t16, ops16) = results["float32"], results["mixed_bfloat16"]
    print(f"step wall time (unprofiled, mean of 3): float32 {t32:.1f} ms, "
          f"mixed_bfloat16 {t16:.1f} ms (x{t32 / t16:.2f})")
    print("| op type | float32 ms | mixed_bfloat16 ms |")
    print("|---|---|---|")
    names = sorted(set(ops32) | set(ops16), key=lambda k: -(ops32[k] + ops16[k]))
    for name in names[: own.top]:
        print(f"| {name} | {ops32[name]:.1f} | {ops16[name]:.1f} |")
    for label, ops in (("float32", ops32), ("mixed_bfloat16", ops16)):
        total = sum(ops.values())
        matmul = sum(v for k, v in ops.items() if "MatMul" in k)
        print(f"{label}: op time {total:.0f} ms per step, matmuls {100 * matmul / total:.0f}%")


if __name__ == "__main__":
    main()
