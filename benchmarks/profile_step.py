"""Where a Transformer training step spends its time, op type by op type, float32 and bfloat16.

Builds the models of `bf16_training.py` (same flags), runs a few `train_on_batch` steps under
the TensorFlow profiler and sums the recorded op times by op type (`_MklMatMul`,
`StatelessRandomUniformV2`, `Cast`, ...), per step, for each policy. Op times are summed over
the threads that ran them, so a column can exceed the step's wall time; compare the columns,
not the totals with the step time. This is how the two bfloat16 costs of RESULTS.md (dropout's
random numbers, the float32 vocabulary projection) were found.

    python benchmarks/profile_step.py
    python benchmarks/profile_step.py --dim 512 --ffn 2048 --top 25
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import tempfile
import time

from _common import header
from bf16_training import build, synthetic_batch
from bf16_training import parse_args as bf16_args


def parse_args(argv=None):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per policy")
    parser.add_argument("--top", type=int, default=20, help="op types to list")
    own, rest = parser.parse_known_args(argv)
    return own, bf16_args(rest)


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
