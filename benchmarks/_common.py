"""What the benchmarks share: quiet TensorFlow, a run header, side-by-side timing, the GEMM rate,
a forward + backward step on whichever backend `KERAS_BACKEND` names, and the example scripts'
own code (`example_module`).

The machines these run on are shared and noisy, so nothing here reports a lone absolute time:
every contender runs in the same process, in alternating rounds (the order rotates each round,
so a slow phase of the machine hits all of them alike), and the benchmarks report medians and
ratios of medians. The float32 GEMM rate is measured in the same rounds, as the ceiling.
"""

from __future__ import annotations

import ast
import datetime
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples")


def example_module(name: str):
    """`examples/<name>.py`, imported by its path: what only a script holds (its `DEFAULTS`,
    `MODEL_FLAGS`, `build_model`) and the scripts' argument parsing (`translation_args`,
    `example_utils`), which stay beside the scripts so that `--help` answers before TensorFlow
    is imported. The shared code itself is `keras_attn.recipes`.

    The modules it imports from beside it (`from translation_args import ...`) are imported the
    same way first, under their own names, as when the script runs; the import path is left as
    it is.
    """
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(EXAMPLES, f"{name}.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for sibling in names:
            if os.path.isfile(os.path.join(EXAMPLES, f"{sibling}.py")):
                example_module(sibling)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def backend_version() -> str:
    """`"<backend> <version>"` of the Keras backend in use."""
    import importlib

    import keras

    backend = keras.backend.backend()
    return f"{backend} {importlib.import_module(backend).__version__}"


def header(title: str) -> None:
    """Print what the numbers below depend on: date, machine, versions, load."""
    import keras

    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    print(f"# {title}")
    print(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}  "
          f"cpu: {cpu_model()} x {os.cpu_count()}  load avg: "
          + " ".join(f"{x:.2f}" if isinstance(x, float) else x for x in load))
    print(f"backend: {backend_version()}  keras {keras.__version__}  "
          f"python {platform.python_version()}")


def sync(result) -> None:
    """Wait for a result (a tensor or a nested list of tensors) to be computed."""
    while isinstance(result, (list, tuple, dict)):
        result = next(iter(result.values())) if isinstance(result, dict) else result[0]
    if hasattr(result, "block_until_ready"):  # JAX
        result.block_until_ready()
    elif type(result).__module__.startswith("torch"):
        import torch

        if result.is_cuda:
            torch.cuda.synchronize()
    elif hasattr(result, "numpy"):
        result.numpy()


def time_alternating(fns: dict[str, Callable[[], object]], rounds: int,
                     warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of every function, measured in alternating rounds.

    Each function is called `warmup` times first (tracing, compilation). Then `rounds` rounds
    call every function once each, the order rotated by one every round.

    Returns:
        `{name: [seconds, ...]}` with `rounds` timings per function.
    """
    for fn in fns.values():
        for _ in range(warmup):
            sync(fn())
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            sync(fns[name]())
            times[name].append(time.perf_counter() - start)
    return times


def median(values) -> float:
    return statistics.median(values)


def gemm(n: int = 2048, dtype: str = "float32"):
    """A plain `(n, n) @ (n, n)` matmul on the backend (under tf.function, jax.jit, or torch
    eager): `(call, flops)`."""
    import keras

    backend = keras.backend.backend()
    a = keras.ops.cast(keras.random.normal((n, n)), dtype)
    b = keras.ops.cast(keras.random.normal((n, n)), dtype)
    if backend == "tensorflow":
        import tensorflow as tf

        matmul = tf.function(lambda: tf.matmul(a, b))
    elif backend == "jax":
        import jax

        product = jax.jit(lambda a, b: a @ b)
        matmul = lambda: product(a, b)
    else:
        matmul = lambda: a @ b
    return matmul, 2.0 * n**3


def forward_backward(layer, call, x, mode: str = "default"):
    """A function running `call(layer, x)` forward and backward: the gradients of
    `sum(y * y)` with respect to `x` and every trainable weight of `layer`, as training would
    run it on each backend: `tf.function` (`mode="xla"`: `jit_compile=True`) on TensorFlow,
    `jax.jit(jax.grad(...))` on JAX (weights through a `keras.StatelessScope`), eager autograd
    on torch (what `fit` runs there)."""
    import keras

    backend = keras.backend.backend()
    weights = layer.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=mode == "xla")
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = call(layer, x)
                loss = tf.reduce_sum(tf.cast(y, "float32") ** 2)
            return tape.gradient(loss, [x] + weights)

        return lambda: step(x)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        def loss(values, x):
            with keras.StatelessScope(state_mapping=list(zip(weights, values))):
                y = call(layer, x)
            return jnp.sum(y.astype("float32") ** 2)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        values = [w.value for w in weights]
        return lambda: grad(values, x)
    import torch

    def step():
        xt = x.detach().requires_grad_(True)
        y = call(layer, xt)
        return torch.autograd.grad((y.float() ** 2).sum(), [xt] + [w.value for w in weights])

    return step


def rss_bytes(pid: int | str = "self", field: str = "VmRSS") -> int:
    """Resident memory of a process from /proc (VmRSS now, VmHWM peak); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


GIB = 1024.0**3


def run_measured(cmd: list[str], max_rss_gib: float, time_limit: float) -> dict:
    """Run `cmd` (a worker printing one JSON line) in a fresh process, polling its RSS.

    Returns:
        The worker's JSON with `"status": "ok"`, or `{"status": why, "peak": bytes}` when it
        was killed (RSS past `max_rss_gib`, or past `time_limit` seconds) or failed.
    """
    import json
    import subprocess

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    start, polled_peak, killed = time.monotonic(), 0, None
    while proc.poll() is None:
        polled_peak = max(polled_peak, rss_bytes(proc.pid))
        if polled_peak > max_rss_gib * GIB:
            killed = f"killed: RSS > {max_rss_gib:g} GiB"
        elif time.monotonic() - start > time_limit:
            killed = f"killed: > {time_limit:g} s"
        if killed:
            proc.kill()
            proc.wait()
            return {"status": killed, "peak": polled_peak}
        time.sleep(0.05)
    out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1][:160]
        return {"status": f"failed (exit {proc.returncode}): {tail}", "peak": polled_peak}
    result = json.loads(lines[-1])
    result["status"] = "ok"
    return result
