"""Time and peak memory of attention forward + backward against sequence length.

Compares, on (batch 1, heads H, length T, head size d) float32 self-attention:

- dense:   `keras_attn.ops.dot_product_attention` (the (T, T) matrix, O(T²) memory);
- chunked: exact attention blockwise over keys (`ops.dot_product_attention(...,
           implementation="chunked")`), O(T) memory;
- linear:  `linear_attention` (elu + 1 features), O(T) time and memory;
- local:   `local_dot_product_attention` with a sliding window, O(T·w).

Each (method, length) runs in its own subprocess, so its peak resident memory is its own; the
parent polls the child's RSS and kills it past `--mem-limit-gb`. A method is not run at a length
whose estimated memory exceeds the limit or whose predicted time exceeds `--time-limit`. Prints
markdown tables and writes a log-log plot.

    python benchmarks/scaling.py                     # 1k ... 64k, about 10 minutes on 2 cores
    python benchmarks/scaling.py --lengths 1024 4096 --methods dense local
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

METHODS = ("dense", "chunked", "linear", "local")
# Rough growth of run time when the length doubles: quadratic methods x4, the others x2.
GROWTH = {"dense": 4.0, "chunked": 4.0, "linear": 2.0, "local": 2.0}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64, help="head size d")
    parser.add_argument("--window", type=int, default=128, help="local attention half-width")
    parser.add_argument("--chunk-size", type=int, default=512, help="chunked: keys per block")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    parser.add_argument("--mem-limit-gb", type=float, default=6.0, help="per subprocess")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="skip a length whose predicted forward+backward time exceeds this")
    parser.add_argument("--plot", default=os.path.join(os.path.dirname(__file__),
                                                       "scaling.png"))
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"),
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.machine()


def chunked_fn(chunk_size: int):
    """The blockwise exact attention of `keras_attn.ops.dot_product_attention`."""
    from keras_attn import ops as attn_ops

    def attend(q, k, v):
        return attn_ops.dot_product_attention(q, k, v, implementation="chunked",
                                              chunk_size=chunk_size)[0]

    return attend, "ops.dot_product_attention(implementation='chunked')"


def worker(args) -> None:
    """One measurement; prints a JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    from keras_attn import ops as attn_ops
    from keras_attn.ops import linear_attention, local_dot_product_attention

    method, length = args.worker[0], int(args.worker[1])
    source = method
    if method == "dense":
        def attend(q, k, v):
            return attn_ops.dot_product_attention(q, k, v)[0]
    elif method == "chunked":
        attend, source = chunked_fn(args.chunk_size)
        if attend is None:
            print(json.dumps({"skipped": "chunked attention not in keras_attn yet"}))
            return
    elif method == "linear":
        def attend(q, k, v):
            return linear_attention(q, k, v)
    else:
        def attend(q, k, v):
            return local_dot_product_attention(q, k, v, args.window)

    rng = np.random.default_rng(0)
    shape = (1, args.heads, length, args.dim)
    q, k, v = (tf.constant(rng.standard_normal(shape, dtype=np.float32)) for _ in range(3))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(attend(q, k, v))
        return tape.gradient(loss, [q, k, v])

    baseline = _rss_bytes()
    start = time.perf_counter()
    [g.numpy() for g in step()]  # trace + first run
    first = time.perf_counter() - start
    repeats = args.repeats if first < 10 else 1
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        [g.numpy() for g in step()]
        times.append(time.perf_counter() - start)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": float(np.median(times)), "peak_mb": peak / 2**20,
                      "attention_mb": (peak - baseline) / 2**20, "source": source}))


def estimated_bytes(method: str, length: int, args) -> float:
    """What a method needs at least (a few live copies of its largest tensor)."""
    h, d = args.heads, args.dim
    if method == "dense":
        return 4 * h * length * length * 4.0  # scores, weights, their gradients
    if method == "local":
        return 4 * h * length * 3 * max(args.window, 1) * 4.0
    return 12 * h * length * d * 4.0 + 4 * h * length * args.chunk_size * 4.0


def run_one(method: str, length: int, args) -> dict:
    """Runs the worker in a subprocess, watching its RSS."""
    cmd = [sys.executable, __file__, "--worker", method, str(length)] + [
        f"--{name}={getattr(args, name.replace('-', '_'))}"
        for name in ("heads", "dim", "window", "chunk-size", "repeats")
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limit, killed = args.mem_limit_gb * 2**30, False
    while proc.poll() is None:
        try:
            if _rss_bytes(proc.pid) > limit:
                proc.kill()
                killed = True
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.05)
    stdout, stderr = proc.communicate()
    if killed:
        return {"skipped": f"over {args.mem_limit_gb:g} GB"}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"skipped": f"failed (rc={proc.returncode}): {stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def markdown(results: dict, args) -> str:
    methods = [m for m in args.methods if m in results]
    lines = []
    for title, key, fmt in (("forward + backward time (ms)", "seconds", "{:.0f}"),
                            ("peak RSS above the inputs (MB)", "attention_mb", "{:.0f}")):
        lines += [f"\n{title}\n", "| T | " + " | ".join(methods) + " |",
                  "|---:|" + "---:|" * len(methods)]
        for length in args.lengths:
            cells = []
            for m in methods:
                r = results[m].get(length, {})
                if key in r:
                    value = r[key] * (1000 if key == "seconds" else 1)
                    cells.append(fmt.format(value))
                else:
                    cells.append("–")
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
    sources = sorted({f"{m}: {r['source']}" for m in methods for r in results[m].values()
                      if "source" in r and r["source"] != m})
    if sources:
        lines += ["", "Implementations:"] + [f"- {s}" for s in sources]
    notes = sorted({f"{m} at {length}: {r['skipped']}" for m in methods
                    for length, r in results[m].items() if "skipped" in r})
    if notes:
        lines += ["", "Not measured:"] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def plot(results: dict, args) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "seconds", "forward + backward (s)"),
                           (axes[1], "attention_mb", "peak RSS above inputs (MB)")):
        for method in args.methods:
            points = [(t, r[key]) for t, r in sorted(results.get(method, {}).items())
                      if key in r]
            if points:
                ax.loglog(*zip(*points), marker="o", label=method, base=2)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"batch 1, {args.heads} heads, d={args.dim}, window {args.window}, float32")
    fig.savefig(args.plot, dpi=100, bbox_inches="tight")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    results: dict = {m: {} for m in args.methods}
    started = time.perf_counter()
    for method in args.methods:
        previous, previous_len = None, None
        for length in sorted(args.lengths):
            if estimated_bytes(method, length, args) > args.mem_limit_gb * 2**30:
                results[method][length] = {"skipped": f"est. > {args.mem_limit_gb:g} GB"}
                continue
            if previous and previous * GROWTH[method] ** math.log2(
                length / previous_len
            ) > args.time_limit:
                results[method][length] = {"skipped": f"predicted > {args.time_limit:g} s"}
                continue
            result = run_one(method, length, args)
            results[method][length] = result
            print(f"{method:8s} T={length:6d} {json.dumps(result)}", flush=True)
            previous, previous_len = result.get("seconds"), length
            if "skipped" in result and "chunked attention not in" in result["skipped"]:
                break
    print(f"\n{datetime.date.today()} · {cpu_model()} · "
          f"{os.cpu_count()} CPUs · total {time.perf_counter() - started:.0f} s")
    print(markdown(results, args))
    plot(results, args)
    print(f"\nplot: {args.plot}")
    return results


if __name__ == "__main__":
    main()
