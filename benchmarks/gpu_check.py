"""The GPU check: the fused kernel's correctness, and keras_attn against Keras, keras-hub and
Hugging Face transformers on JAX and torch, printed as one table.

    bash benchmarks/gpu_check.sh WHEEL_DIR   # on the GPU machine: installs, then runs this
    bash benchmarks/gpu_check.sh --dry-run   # tiny shapes, any machine: the same code
    PYTHONPATH=.:tests python benchmarks/gpu_check.py --dry-run  # the same, by hand

Each backend runs in a process of its own (`KERAS_BACKEND`), the 16k memory part in one more:

(a) correctness: `dot_product_attention(implementation="fused")` against the float64 NumPy
    reference (tests/reference.py) next to the dense kernel, for every mask kind, grouped-query
    heads and a bias, outputs and gradients, float32 and bfloat16; the fused error may not
    exceed twice the dense kernel's plus one unit of the dtype's rounding (the rule of
    tests/test_fused_kernel.py). Then `flash_attention=True` (bfloat16, causal).
(b) `MultiHead(implementation="fused", flash_attention=True)` against
    `keras.layers.MultiHeadAttention(flash_attention=True)` with the same weights, bfloat16,
    forward + backward, T = 1k, 4k, 16k (the dense kernel beside them up to 4k).
(c) the GPT-2-style causal-LM training step (`lm_training_speed.py`'s models, mixed
    bfloat16) against keras-hub's `GPT2CausalLM`, then one 16k-token step per kernel: peak
    device memory, and whether it fits the `--budget-gib` a smaller GPU has.
(d) greedy generation tokens/s of a GPT-2-small-shaped model (random weights, no download):
    keras_attn, keras-hub, and transformers' `GPT2LMHeadModel` (torch), bfloat16, at batch 1
    and the size's batch (keras_attn's defaults: one `jax.jit` program on JAX, each token's
    step under `torch.compile` with CUDA graphs on a torch GPU).

Timings alternate in rounds (`_common.time_alternating`) and report medians and ratios. The
exit status is 1 when a correctness row fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# keras_attn and the tests' helpers (`reference`, `backend_utils`) come from PYTHONPATH, which
# gpu_check.sh sets to the repository and its tests/; `_common` and `lm_training_speed` are
# beside this script (Python imports first from a script's own folder, in the workers too).

FULL = {"check": (2, 4, 2, 128, 192, 64), "attn_lengths": (1024, 4096, 16384),
        "attn_tokens": 16384, "attn_dim": 1024, "attn_heads": 16, "dense_up_to": 4096,
        "lm_lengths": (1024, 4096), "lm_tokens": 16384, "long": 16384,
        "gen": (12, 768, 12, 3072, 50257, 8, 32, 96), "rounds": 5}
DRY = {"check": (2, 4, 2, 8, 12, 8), "attn_lengths": (32, 64), "attn_tokens": 128,
       "attn_dim": 32, "attn_heads": 2, "dense_up_to": 64, "lm_lengths": (32,),
       "lm_tokens": 64, "long": 128, "gen": (1, 32, 2, 64, 97, 2, 4, 4), "rounds": 1}
EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7}
ROW = "ROW "


def emit(part: str, what: str, keras_attn: str, reference: str, result: str) -> None:
    """One row of the table, as a JSON line the parent collects."""
    import keras

    row = {"part": part, "backend": keras.backend.backend(), "what": what,
           "keras_attn": keras_attn, "reference": reference, "result": result}
    print(ROW + json.dumps(row), flush=True)


def device() -> str:
    from keras_attn import tuning

    return tuning.device_kind()


# ---- (a) correctness ---------------------------------------------------------------------

def check_correctness(size) -> None:
    import keras
    import numpy as np
    import reference as ref
    from backend_utils import to_np, value_and_grads

    from keras_attn import ops as attn_ops
    from keras_attn.ops import AttentionMask

    batch, heads, kv_heads, q_len, k_len, depth = size["check"]
    rng = np.random.default_rng(0)
    q = (2 * rng.normal(size=(batch, heads, q_len, depth))).astype("float32")
    k = (2 * rng.normal(size=(batch, kv_heads, k_len, depth))).astype("float32")
    v = rng.normal(size=(batch, kv_heads, k_len, depth)).astype("float32")
    bias = rng.normal(size=(1, heads, q_len, k_len)).astype("float32")

    def measure(dtype, build, inputs, flash=None):
        """`(worst fused error, worst dense error, within the rule)` against the reference
        on the inputs rounded to `dtype`."""
        query_len, key_len = inputs[0].shape[-2], inputs[1].shape[-2]
        d_out = np.random.default_rng(1).normal(size=inputs[0].shape)
        rounded = [to_np(keras.ops.cast(x, dtype)) for x in inputs[:3]]
        want, want_grads = ref.grouped_attention(
            *rounded, ref.mask_of(build, batch, query_len, key_len),
            inputs[3] if len(inputs) > 3 else None, d_out)
        expected = [want] + list(want_grads)
        errors = {}
        for implementation in ("dense", "fused"):
            def fn(*xs, implementation=implementation):
                q, k, v = (keras.ops.cast(x, dtype) for x in xs[:3])
                mask = AttentionMask.build(query_len, key_len, batch, **build) if build \
                    else None
                out, _ = attn_ops.dot_product_attention(
                    q, k, v, mask, bias=xs[3] if len(xs) > 3 else None,
                    implementation=implementation, return_weights=False,
                    flash_attention=flash if implementation == "fused" else None)
                return keras.ops.cast(out, "float32")

            out, grads = value_and_grads(fn, inputs, d_out)
            errors[implementation] = [
                float(np.max(np.abs(g - e))) if np.isfinite(g).all() else float("inf")
                for g, e in zip([out] + list(grads), expected)]
        scales = [float(np.max(np.abs(e))) for e in expected]
        ok = all(f <= 2 * d + EPS[dtype] * s
                 for f, d, s in zip(errors["fused"], errors["dense"], scales))
        return max(errors["fused"]), max(errors["dense"]), ok

    kinds = ref.mask_kinds(batch, q_len, k_len)
    for dtype in ("float32", "bfloat16"):
        failures, worst = [], [0.0, 0.0]
        for name, build in kinds.items():
            fused_error, dense_error, ok = measure(dtype, build, [q, k, v, bias])
            worst = [max(worst[0], fused_error), max(worst[1], dense_error)]
            if not ok:
                failures.append(name)
        emit("a", f"fused vs reference: {len(kinds)} mask kinds, GQA {heads}/{kv_heads}, "
             f"bias, {dtype}", f"max error {worst[0]:.2e}", f"dense {worst[1]:.2e}",
             "FAIL: " + " ".join(failures) if failures else "pass")
    if device() != "gpu":
        emit("a", "flash_attention=True", "-", "-", f"skipped: no GPU ({device()})")
        return
    square = (2 * rng.normal(size=(batch, heads, k_len, depth))).astype("float32")
    what = "flash_attention=True, causal, bfloat16"
    try:
        fused_error, dense_error, ok = measure("bfloat16", {"use_causal_mask": True},
                                               [square, k, v], flash=True)
        emit("a", what, f"max error {fused_error:.2e}", f"dense {dense_error:.2e}",
             "pass" if ok else "FAIL")
    except ValueError as error:
        emit("a", what, "-", "-", f"FAIL: {error}"[:160])


# ---- (b) MultiHead vs Keras MHA with flash -------------------------------------------------

def attention_speed(size) -> None:
    import keras
    from _common import forward_backward, median, time_alternating

    from keras_attn.layers import MultiHead

    gpu = device() == "gpu"
    flash = True if gpu else None
    dim, heads = size["attn_dim"], size["attn_heads"]
    for length in size["attn_lengths"]:
        batch = max(1, size["attn_tokens"] // length)
        x = keras.ops.cast(keras.random.normal((batch, length, dim)), "bfloat16")
        reference = keras.layers.MultiHeadAttention(heads, dim // heads, dtype="bfloat16",
                                                    flash_attention=flash)
        reference(x, x)
        layers = {"keras": reference,
                  "fused": MultiHead.from_keras(reference, implementation="fused",
                                                flash_attention=flash)}
        if length <= size["dense_up_to"]:
            layers["dense"] = MultiHead.from_keras(reference)
        fns = {name: forward_backward(layer, (lambda l, x: l(x, x)) if name == "keras"
                                      else (lambda l, x: l(x)), x)
               for name, layer in layers.items()}
        times = time_alternating(fns, size["rounds"])
        ms = {name: median(t) * 1e3 for name, t in times.items()}
        what = f"MultiHead vs MHA, flash={flash}, bf16 fwd+bwd, B{batch} T{length} d{dim} h{heads}"
        dense = f", dense {ms['dense'] / ms['keras']:.2f}x" if "dense" in ms else ""
        emit("b", what, f"fused {ms['fused']:.1f} ms", f"keras {ms['keras']:.1f} ms",
             f"{ms['fused'] / ms['keras']:.2f}x{dense}")


# ---- (c) causal-LM training step -----------------------------------------------------------

def lm_args(length_tokens: int):
    return argparse.Namespace(vocab_size=2048, num_layers=2, dim=128, heads=4, ffn_dim=512,
                              jit=False, hub_accuracy=False, tokens=length_tokens)


def lm_step(size) -> None:
    import keras
    import numpy as np
    from _common import median, time_alternating
    from lm_training_speed import models

    keras.config.set_dtype_policy("mixed_bfloat16")
    args = lm_args(size["lm_tokens"])
    rng = np.random.default_rng(0)
    for length in size["lm_lengths"]:
        batch = max(1, args.tokens // length)
        ids = rng.integers(1, args.vocab_size, (batch, length + 1)).astype("int32")
        x, y = ids[:, :-1], ids[:, 1:]
        fns = {}
        for implementation in ("dense", "fused"):
            ours, hub = models(length, args, implementation)
            fns[implementation] = lambda ours=ours, x=x, y=y: ours.train_on_batch(x, y)
        hub_x = {"token_ids": x, "padding_mask": np.ones_like(x, dtype="bool")}
        fns["keras_hub"] = lambda hub=hub, x=hub_x, y=y: hub.train_on_batch(x, y)
        times = time_alternating(fns, size["rounds"], warmup=2)
        ms = {name: median(t) * 1e3 for name, t in times.items()}
        emit("c", f"causal LM step, 2 x d128, mixed bf16, B{batch} T{length}",
             f"fused {ms['fused']:.1f} ms, dense {ms['dense']:.1f} ms",
             f"keras-hub {ms['keras_hub']:.1f} ms",
             f"{ms['fused'] / ms['keras_hub']:.2f}x (dense {ms['dense'] / ms['keras_hub']:.2f}x)")


def peak_bytes() -> int:
    import keras

    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("peak_bytes_in_use", 0))


def long_step(size, budget_gib: float) -> None:
    """One step at `size["long"]` tokens per kernel, the kernels in the order of the memory
    they should need (JAX's peak cannot be reset: each figure is the peak so far)."""
    import keras
    import numpy as np
    from lm_training_speed import models

    keras.config.set_dtype_policy("mixed_bfloat16")
    length = size["long"]
    args = lm_args(length)
    ids = np.random.default_rng(0).integers(1, args.vocab_size, (1, length + 1)).astype("int32")
    for implementation in ("chunked", "fused", "dense"):
        if keras.backend.backend() == "torch":
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
        try:
            ours, _ = models(length, args, implementation)
            start = time.perf_counter()
            ours.train_on_batch(ids[:, :-1], ids[:, 1:])
            seconds = time.perf_counter() - start
            peak = peak_bytes() / 2**30
            fits = "fits" if peak <= budget_gib else "over"
            emit("c", f"causal LM step, B1 T{length}, {implementation}",
                 f"peak {peak:.2f} GiB", f"{seconds:.1f} s (first step)",
                 f"{fits} {budget_gib:g} GiB" if peak else "peak not measured (no GPU)")
        except Exception as error:  # noqa: BLE001 - an out-of-memory error is the finding
            emit("c", f"causal LM step, B1 T{length}, {implementation}", "does not fit",
                 "-", f"{type(error).__name__}: {str(error)[:80]}")
        keras.backend.clear_session()


# ---- (d) generation ------------------------------------------------------------------------

def generation(size) -> None:
    import keras
    import keras_hub

    import keras_attn as ka

    layers, dim, heads, ffn, vocab, batch, prompt_len, new = size["gen"]
    total = prompt_len + new
    keras.config.set_dtype_policy("bfloat16")
    ours = ka.models.causal_lm(vocab, num_layers=layers, hidden_dim=dim, num_heads=heads,
                               intermediate_dim=ffn, position_encoding="learned",
                               max_sequence_length=total, norm="layer",
                               activation="gelu_tanh", tie_word_embeddings=True,
                               implementation="auto")
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=layers, num_heads=heads, hidden_dim=dim,
        intermediate_dim=ffn, dropout=0.0, max_sequence_length=total)
    hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    hub.compile(sampler="greedy")
    for rows in sorted({1, batch}):
        _generation_row(ours, hub, rows, size, (layers, dim, heads, ffn, vocab, prompt_len, new))


def _generation_row(ours, hub, batch, size, shape) -> None:
    """One row of (d): keras_attn (on torch its default, the steps compiled with CUDA graphs
    on a GPU), keras-hub and (torch) transformers at `batch`, and keras_attn's first call."""
    import time

    import keras
    import numpy as np
    from _common import median, sync, time_alternating

    import keras_attn as ka

    layers, dim, heads, ffn, vocab, prompt_len, new = shape
    total = prompt_len + new
    prompt = np.random.default_rng(0).integers(4, vocab, (batch, prompt_len)).astype("int32")
    padded = np.zeros((batch, total), "int32")
    padded[:, :prompt_len] = prompt
    hub_inputs = {"token_ids": padded, "padding_mask": padded != 0}
    fns = {"keras_attn": lambda: ka.decoding.generate(ours, prompt, total, stop_token_ids=None),
           "keras_hub": lambda: hub.generate(hub_inputs, stop_token_ids=None)}
    if keras.backend.backend() == "torch":
        fns["transformers"] = hf_generate(layers, dim, heads, ffn, vocab, prompt, new)
    first = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        sync(fn())
        first[name] = time.perf_counter() - start
    times = time_alternating(fns, size["rounds"], warmup=0)
    rate = {name: batch * new / median(t) for name, t in times.items()}
    others = ", ".join(f"{name} {rate[name]:.0f}" for name in rate if name != "keras_attn")
    emit("d", f"greedy generation tokens/s, {layers} x d{dim}, bf16, B{batch}, "
         f"{prompt_len} + {new} tokens (keras_attn's first call {first['keras_attn']:.0f} s)",
         f"{rate['keras_attn']:.0f}", others,
         " / ".join(f"{rate['keras_attn'] / rate[name]:.2f}x {name}"
                    for name in rate if name != "keras_attn"))


def hf_generate(layers, dim, heads, ffn, vocab, prompt, new):
    """transformers' GPT-2 of the same shape, random weights, greedy to exactly `new`
    tokens."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab, n_positions=prompt.shape[1] + new, n_embd=dim,
                        n_layer=layers, n_head=heads, n_inner=ffn)
    device_name = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT2LMHeadModel(config).to(device_name, torch.bfloat16).eval()
    ids = torch.tensor(prompt, dtype=torch.long, device=device_name)

    def run():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=new, min_new_tokens=new, pad_token_id=0)

    return run


# ---- the parent: one process per backend, one table ------------------------------------------

def worker(args) -> None:
    size = DRY if args.dry_run else FULL
    parts = {"a": check_correctness, "b": attention_speed, "c": lm_step, "d": generation}
    if args.long:
        long_step(size, args.budget_gib)
        return
    for part in args.parts:
        try:
            parts[part](size)
        except Exception as error:  # noqa: BLE001 - one part's failure is a row, not the end
            emit(part, "part failed", "-", "-", f"FAIL: {type(error).__name__}: "
                 f"{str(error)[:120]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "torch"],
                        choices=["jax", "torch", "tensorflow"])
    parser.add_argument("--parts", nargs="+", default=list("abcd"), choices=list("abcd"))
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes (a CPU run)")
    parser.add_argument("--budget-gib", type=float, default=16.0,
                        help="the device memory a 16k causal-LM step should fit in")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds for the whole check: a worker that would start later "
                             "than 30 s before it is skipped, one still running at it is "
                             "stopped (its rows so far kept)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--long", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    start = time.perf_counter()
    rows = []
    for backend in args.backends:
        runs = [["--parts", *args.parts]] + ([["--long"]] if "c" in args.parts else [])
        for extra in runs:
            command = [sys.executable, os.path.abspath(__file__), "--worker",
                       "--budget-gib", str(args.budget_gib), *extra]
            command += ["--dry-run"] if args.dry_run else []
            env = dict(os.environ, KERAS_BACKEND=backend, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                       TF_CPP_MIN_LOG_LEVEL="3")
            left = None if args.deadline is None else args.deadline - (
                time.perf_counter() - start)
            if left is not None and left < 30:
                rows.append({"part": "-", "backend": backend, "what": f"worker {extra}",
                             "keras_attn": "-", "reference": "-",
                             "result": "SKIPPED: the --deadline was near"})
                continue
            rows += run_worker(command, env, backend, left)
    print(f"# keras_attn GPU check ({'dry run, tiny shapes' if args.dry_run else 'full'}), "
          f"{time.perf_counter() - start:.0f} s, {gpu_name()}")
    print("| part | backend | what | keras_attn | reference | result |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(row[key]) for key in ("part", "backend", "what",
                                                         "keras_attn", "reference",
                                                         "result")) + " |")
    return 1 if any(str(row["result"]).startswith("FAIL") for row in rows) else 0


def run_worker(command: list, env: dict, backend: str, seconds: float | None) -> list:
    """Run one worker, echoing its rows as they come (so a run stopped by its time limit
    keeps them), stopped after `seconds`; its rows, and a FAIL row if it failed."""
    import tempfile

    rows = []
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=errors,
                                   text=True)
        deadline = None if seconds is None else time.perf_counter() + seconds
        for line in process.stdout:
            if line.startswith(ROW):
                print(line.rstrip(), file=sys.stderr, flush=True)
                rows.append(json.loads(line[len(ROW):]))
            if deadline is not None and time.perf_counter() > deadline:
                process.kill()
                break
        try:
            code = process.wait(timeout=None if deadline is None else max(
                1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            process.kill()
            code = "stopped at the --deadline"
        if code != 0:
            errors.seek(0)
            tail = (errors.read().strip().splitlines() or ["no output"])[-1][:160]
            rows.append({"part": "-", "backend": backend, "what": "worker",
                         "keras_attn": "-", "reference": "-",
                         "result": f"FAIL: exit {code}: {tail}"})
    return rows


def gpu_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, check=False)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 else "no GPU"
    except (OSError, IndexError):
        return "no GPU"


if __name__ == "__main__":
    sys.exit(main())
